"""The bodies of `/v1/rerank` (also `/rerank`, `/v2/rerank`) and `/v1/score` (also `/score`), in
vLLM's shapes, read into the pairs to score; and the answers written back. Pure: no model, no I/O.

Rerank (Jina's and Cohere's shape, as vLLM serves it): `{"model"?, "query", "documents": [text |
{"text"}], "top_n"?, "return_documents"?}` -> `{"id", "model", "usage", "results": [{"index",
"relevance_score", "document"?: {"text"}}]}`, best first; `top_n` 0 or absent keeps them all.
Score: `{"model"?, "text_1": text | [texts], "text_2": text | [texts]}` -> `{"id", "object":
"list", "created", "model", "data": [{"index", "object": "score", "score"}], "usage"}`; one
text_1 is scored against every text_2 (1:N), or as many as text_2 pairwise (N:N), as vLLM pairs them.

`model` absent means the default model (vLLM's rule); a name neither model has is
`model_not_found`. vLLM's pooling fields are taken at their defaults only (`truncate_prompt_tokens`
-1, `use_activation` true, `priority` 0; `padding`, `truncation_side`, `mm_processor_kwargs`
null) and refused otherwise, naming the field; `user`, `request_id` and `cache_salt` are accepted
and not used; any other field is `unknown_field`.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from gateway.doors import openai_schema as oa
from gateway.request import ProtocolError
from ops.core.settings import GatewaySettings, Settings

COMMON_FIELDS = {"model", "user", "request_id", "cache_salt"}
# vLLM's pooling fields, each with the values that mean what Brigade does anyway.
AT_DEFAULT = {
    "truncate_prompt_tokens": ((None, -1), "every pair is cut to the words the model reads (longest text first): "
                                           "send -1 or leave it out"),
    "use_activation": ((None, True), "scores are the model's own (the pair model's probability, the embedding "
                                     "model's cosine): send true or leave it out"),
    "priority": ((None, 0), "requests are answered in arrival order: send 0 or leave it out"),
    "padding": ((None,), "is not supported: leave it out"),
    "truncation_side": ((None,), "is not supported: leave it out"),
    "mm_processor_kwargs": ((None,), "is not supported: only text is scored"),
}
RERANK_FIELDS = COMMON_FIELDS | set(AT_DEFAULT) | {"query", "documents", "top_n", "return_documents"}
SCORE_FIELDS = COMMON_FIELDS | set(AT_DEFAULT) | {"text_1", "text_2"}
NEWER_SCORE_FIELDS = {"queries", "documents", "items", "data_1", "data_2"}  # vLLM's later spellings


@dataclass(frozen=True)
class PairsAsk:
    """What to score: `firsts[i]` against `seconds[i]`, with the model asked for (None: the default)."""

    model: str | None
    firsts: list[str]
    seconds: list[str]


@dataclass(frozen=True)
class RerankAsk:
    pairs: PairsAsk  # the query against each document, in the documents' order
    top_n: int  # 0: every document
    return_documents: bool

    @property
    def documents(self) -> list[str]:
        return self.pairs.seconds


def _invalid(field: str, why: str) -> ProtocolError:
    return ProtocolError("invalid_field", f"`{field}` {why}", None, field)


def _common(body: Any, known: set[str]) -> str | None:
    """The checks both bodies share; the model asked for."""
    body = oa.checked_body(body, known, AT_DEFAULT)
    for field in ("user", "request_id", "cache_salt"):
        if body.get(field) is not None and not isinstance(body[field], str):
            raise _invalid(field, "must be a string")
    model = body.get("model")
    if model is not None and (not isinstance(model, str) or not model):
        raise _invalid("model", "must be a non-empty string")
    return model


def _text(value: Any, where: str, settings: GatewaySettings) -> str:
    """A text of the body; `where` names it (`documents[2]`), the error's param its field (`documents`)."""
    field = where.split("[")[0]
    if not isinstance(value, str) or not value:
        raise ProtocolError("invalid_field", f"`{where}` must be a non-empty string", None, field)
    if len(value) > settings.rerank_max_text_chars:
        raise ProtocolError("prompt_too_long", f"`{where}` has {len(value)} characters; the limit is "
                            f"{settings.rerank_max_text_chars} (BRIGADE_RERANK_MAX_TEXT_CHARS)", None, field)
    return value


def _count(n: int, field: str, settings: GatewaySettings) -> None:
    if n > settings.rerank_max_documents:
        raise _invalid(field, f"has {n} items; the limit is {settings.rerank_max_documents} "
                              "(BRIGADE_RERANK_MAX_DOCUMENTS)")


def parse_rerank(body: Any, settings: Settings) -> RerankAsk:
    """A rerank body -> the query against each document; what cannot be done is refused naming the field."""
    model = _common(body, RERANK_FIELDS)
    if body.get("query") is None:
        raise ProtocolError("missing_field", "`query` is required: the text the documents are ranked for", None,
                            "query")
    query = _text(body["query"], "query", settings)
    documents = body.get("documents")
    if documents is None:
        raise ProtocolError("missing_field", "`documents` is required: a list of texts (or {\"text\": ...} objects)",
                            None, "documents")
    if not isinstance(documents, list) or not documents:
        raise _invalid("documents", "must be a non-empty list of texts (or {\"text\": ...} objects)")
    _count(len(documents), "documents", settings)
    texts = [_text(_document_text(d, i), f"documents[{i}]", settings) for i, d in enumerate(documents)]
    top_n = body.get("top_n")
    if top_n is not None and (type(top_n) is not int or top_n < 0):
        raise _invalid("top_n", "must be a whole number, 0 or more (0: every document)")
    keep = body.get("return_documents")
    if keep is not None and not isinstance(keep, bool):
        raise _invalid("return_documents", "must be true or false")
    return RerankAsk(PairsAsk(model, [query] * len(texts), texts), top_n or 0, keep is not False)


def _document_text(document: Any, i: int) -> Any:
    """A document is a text, or Cohere's object form `{"text": ...}` (other keys ride along unread)."""
    if isinstance(document, dict):
        if "content" in document and "text" not in document:
            raise ProtocolError("unsupported_field", f"`documents[{i}]`: multimodal content is not supported; "
                                "send the text", None, "documents")
        if "text" not in document:
            raise _invalid("documents", f"item {i} is an object without `text`")
        return document["text"]
    return document


def parse_score(body: Any, settings: Settings) -> PairsAsk:
    """A score body -> its pairs: one text_1 against every text_2, or text_1[i] against text_2[i]."""
    model = _common(body, SCORE_FIELDS | NEWER_SCORE_FIELDS)
    newer = sorted(NEWER_SCORE_FIELDS & set(body))
    if newer:
        raise ProtocolError("unsupported_field", f"`{newer[0]}`: send the texts as `text_1` and `text_2`", None,
                            newer[0])
    sides = []
    for field in ("text_1", "text_2"):
        given = body.get(field)
        if given is None:
            raise ProtocolError("missing_field", f"`{field}` is required: a text or a list of texts", None, field)
        texts = [given] if isinstance(given, str) else given
        if not isinstance(texts, list) or not texts:
            raise _invalid(field, "must be a text or a non-empty list of texts")
        _count(len(texts), field, settings)
        sides.append([_text(t, f"{field}[{i}]" if isinstance(given, list) else field, settings)
                      for i, t in enumerate(texts)])
    firsts, seconds = sides
    if len(firsts) == 1:
        firsts = firsts * len(seconds)
    elif len(firsts) != len(seconds):
        raise _invalid("text_2", f"has {len(seconds)} texts and `text_1` {len(firsts)}: send one text_1 (scored "
                                 "against every text_2) or as many as text_2 (scored pairwise)")
    return PairsAsk(model, firsts, seconds)


def rerank_body(rid: str, model: str, ask: RerankAsk, scores: list[float], tokens: int) -> dict:
    """Best first (ties in the documents' order); the first `top_n`, or all."""
    order = sorted(range(len(scores)), key=lambda i: -scores[i])
    if ask.top_n:
        order = order[:ask.top_n]
    results = []
    for i in order:
        result = {"index": i, "relevance_score": scores[i]}
        if ask.return_documents:
            result["document"] = {"text": ask.documents[i]}
        results.append(result)
    return {"id": f"rerank-{rid}", "model": model, "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
            "results": results}


def score_body(rid: str, model: str, scores: list[float], tokens: int) -> dict:
    return {"id": f"score-{rid}", "object": "list", "created": int(time.time()), "model": model,
            "data": [{"index": i, "object": "score", "score": s} for i, s in enumerate(scores)],
            "usage": {"prompt_tokens": tokens, "total_tokens": tokens, "completion_tokens": 0}}
