"""OpenAI's `POST /v1/embeddings`, served by the answer cache's own embedder (all-MiniLM-L6-v2 by
default): the vectors a client gets are exactly the ones the cache compares, normalised the same
way (unit length, so a dot product is the cosine).

The model is named as the cache's embedding model is (`all-MiniLM-L6-v2`, or the folder name of
BRIGADE_EMBEDDING_MODEL; `sentence-transformers/NAME` too); another name is `model_not_found`.
`GET /v1/models` lists it after the generation models, its card's kind `embedding` (`card()`).

A gateway started without the cache (BRIGADE_CACHE_ENABLED=false) has no embedder and answers
`unavailable` (503) saying so, rather than loading one on the first request: a cache-off gateway
is kept free of torch and the model (hundreds of MB, seconds to load), and a lazy load would
stall that first request and every cache-off gateway's memory plan.

A request is admitted like a chat request (gateway/doors/held_models.py): the caller's key, its
per-key limits, its tokens charged once it is answered. The inputs are embedded in one batched
call, off the event loop.
"""
from __future__ import annotations

import asyncio
import base64
import json
import time
import uuid
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
from starlette.requests import Request
from starlette.responses import Response

from gateway import metrics
from gateway.admission.auth import Authenticator
from gateway.doors import openai_schema as oa
from gateway.doors.held_models import HeldModelAdmission, embedding_model_name, outcome_of
from gateway.doors.http_body import read_json
from gateway.doors.http_errors import error_response, internal_error
from gateway.request import ProtocolError
from ops.core.settings import GatewaySettings, Settings

if TYPE_CHECKING:
    from cache.embedder import Embedder


EMBEDDING_FIELDS = {"model", "input", "encoding_format", "dimensions", "user"}

@dataclass(frozen=True)
class EmbeddingAsk:
    inputs: list[str]
    base64: bool  # encoding_format "base64": little-endian float32 bytes, as OpenAI sends them


def parse_embeddings(body: Any, name: str, dim: int, settings: Settings) -> EmbeddingAsk:
    """A body -> the texts to embed; what the model cannot do is refused naming the field."""
    body = oa.checked_body(body, EMBEDDING_FIELDS)
    model = body.get("model")
    if model is None:
        raise ProtocolError("missing_field", f"`model` is required; this gateway embeds with {name!r}", None, "model")
    if model not in (name, f"sentence-transformers/{name}"):
        raise ProtocolError("model_not_found", f"the embedding model {str(model)[:64]!r} does not exist; models: "
                            f"{name}", None, "model")
    dimensions = body.get("dimensions")
    if dimensions is not None and dimensions != dim:
        raise ProtocolError("unsupported_field", f"`dimensions`: {name} has {dim} dimensions and cannot shorten "
                            f"them; leave `dimensions` out", None, "dimensions")
    fmt = body.get("encoding_format")
    if fmt not in (None, "float", "base64"):
        raise ProtocolError("invalid_field", "`encoding_format` must be \"float\" or \"base64\"", None,
                            "encoding_format")
    user = body.get("user")
    if user is not None and not isinstance(user, str):
        raise ProtocolError("invalid_field", "`user` must be a string", None, "user")
    return EmbeddingAsk(_inputs(body.get("input"), settings), fmt == "base64")


def _inputs(given: Any, settings: GatewaySettings) -> list[str]:
    if given is None:
        raise ProtocolError("missing_field", "`input` is required: a string or a list of strings", None, "input")
    inputs = [given] if isinstance(given, str) else given
    if not isinstance(inputs, list) or not inputs:
        raise ProtocolError("invalid_field", "`input` must be a string or a non-empty list of strings", None, "input")
    if any(isinstance(x, (int, list)) for x in inputs):
        raise ProtocolError("unsupported_field", "`input` as token ids is not supported: send the text", None,
                            "input")
    if len(inputs) > settings.embedding_max_inputs:
        raise ProtocolError("invalid_field", f"`input` has {len(inputs)} items; the limit is "
                            f"{settings.embedding_max_inputs} (BRIGADE_EMBEDDING_MAX_INPUTS)", None, "input")
    for i, text in enumerate(inputs):
        if not isinstance(text, str) or not text:
            raise ProtocolError("invalid_field", f"`input[{i}]` must be a non-empty string", None, "input")
        if len(text) > settings.embedding_max_input_chars:
            raise ProtocolError("prompt_too_long", f"`input[{i}]` has {len(text)} characters; the limit is "
                                f"{settings.embedding_max_input_chars}", None, "input")
    return inputs


def encode(vector: np.ndarray, as_base64: bool) -> list[float] | str:
    if as_base64:
        return base64.b64encode(vector.astype("<f4").tobytes()).decode("ascii")
    return vector.tolist()  # float32 -> the same numbers as Python floats: JSON carries them exactly


def response_body(name: str, vectors: np.ndarray, tokens: int, as_base64: bool) -> dict:
    data = [{"object": "embedding", "index": i, "embedding": encode(v, as_base64)} for i, v in enumerate(vectors)]
    return {"object": "list", "data": data, "model": name, "usage": {"prompt_tokens": tokens, "total_tokens": tokens}}


class EmbeddingsDoor:
    def __init__(self, settings: Settings, auth: Authenticator, admission: HeldModelAdmission):
        self.settings = settings
        self.auth = auth
        self.admission = admission
        self.name = embedding_model_name(settings)
        self.embedder: Embedder | None = None  # the cache's, once it has loaded

    def use_embedder(self, embedder: "Embedder") -> None:
        self.embedder = embedder

    def card(self) -> dict | None:
        """Its `GET /v1/models` card, once the model is loaded (a gateway without the cache has none)."""
        if self.embedder is None:
            return None
        return {"id": self.name, "kind": "embedding", "max_model_len": self.embedder.max_seq_length,
                "dimensions": self.embedder.dim, "endpoints": ["/v1/embeddings", "/v1/score", "/v1/rerank"]}

    async def embeddings(self, request: Request) -> Response:
        started = time.perf_counter()
        rid, key, inputs = uuid.uuid4().hex, None, 0
        try:
            key = await self.auth.authenticate(request.headers.get("authorization"))
            body = await read_json(request, self.settings.max_message_bytes)
            embedder = self._embedder()
            ask = parse_embeddings(body, self.name, embedder.dim, self.settings)
            inputs = len(ask.inputs)
            await self.admission.within_limits(key, rid, self.name)
            try:
                content = await asyncio.to_thread(_answer, embedder, ask, self.name)
            except BaseException:
                self.admission.release(key, rid)
                raise
        except ProtocolError as err:
            self._count(outcome_of(err), inputs)
            return error_response(err)  # Retry-After only where a retry can succeed (limits, Redis)
        except Exception:
            self._count("failed", inputs)
            return internal_error("embeddings_failed", request_id=rid)
        body, tokens = content
        self.admission.settle(key, rid, tokens)
        self._count("served", inputs)
        metrics.EMBEDDING_SECONDS.labels(self.name).observe(time.perf_counter() - started)
        return Response(body, media_type="application/json", headers={"x-request-id": rid})

    def _embedder(self) -> "Embedder":
        if self.embedder is None:
            raise ProtocolError("unavailable", "this gateway runs without the answer cache, whose embedding model "
                                "serves /v1/embeddings: start it with BRIGADE_CACHE_ENABLED=true", None, "model")
        return self.embedder

    def _count(self, outcome: str, inputs: int) -> None:
        metrics.EMBEDDING_REQUESTS.labels(self.name, outcome).inc()
        metrics.EMBEDDING_INPUTS.labels(self.name, outcome).inc(inputs)


def _answer(embedder: "Embedder", ask: EmbeddingAsk, name: str) -> tuple[bytes, int]:
    """The response body and its tokens, on a worker thread: one batched forward for every input,
    and the JSON of up to thousands of vectors, are both too long to hold the event loop."""
    vectors, tokens = embedder.embed(ask.inputs), sum(embedder.token_counts(ask.inputs))
    body = response_body(name, vectors, tokens, ask.base64)
    return json.dumps(body, separators=(",", ":")).encode(), tokens
