"""/v1/rerank (also /rerank, /v2/rerank), /v1/score (also /score) and the models /v1/models lists,
over real HTTP on the OpenAI-door stack (tests/test_openai_api.py imports these tests so that they
run on its one module-scoped stack: `open` holds the cache's real models, `strict` wants keys,
`full` runs without the cache). Not collected on its own (no test_ prefix)."""
from __future__ import annotations

import asyncio
import time

import httpx
import numpy as np
import pytest

from gateway.admission.api_keys import KeyStore
from ops.core.redis_clients import async_client
from tests.openai_doors import MODEL, _scrape, _value
from tests.services import create_key, wait_until

RERANKER = "brigade-pair-model"
EMBEDDER = "all-MiniLM-L6-v2"
QUERY = "How do I reset my password?"
DOCUMENTS = ["The cat sat on the mat.", "I forgot my password, how can I change it?", "What is the capital of France?",
             "How do I reset my router?"]
PARAPHRASE = 1  # DOCUMENTS' index of the one that asks what QUERY asks
RERANK_PATHS = ("/v1/rerank", "/rerank", "/v2/rerank")


def _post(port: int, path: str, body: dict, key: str | None = None) -> httpx.Response:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    return httpx.post(f"http://127.0.0.1:{port}{path}", json=body, headers=headers, timeout=60)


@pytest.fixture(scope="module")
def pair_model():
    """The shipped pair model, loaded here as the gateway loads it: what its scores must be."""
    from cache.pair_model import PairModel

    return PairModel.load(threads=1)


def test_rerank_puts_the_paraphrase_first_with_the_pair_models_own_scores(doors, pair_model):
    r = _post(doors.open, "/v1/rerank", {"query": QUERY, "documents": DOCUMENTS})
    body = r.json()
    assert r.status_code == 200, body
    assert body["model"] == RERANKER and body["id"].startswith("rerank-")
    results = body["results"]
    assert results[0]["index"] == PARAPHRASE and results[0]["document"] == {"text": DOCUMENTS[PARAPHRASE]}
    assert sorted(x["index"] for x in results) == [0, 1, 2, 3]
    scores = [x["relevance_score"] for x in results]
    assert scores == sorted(scores, reverse=True) and all(0 < s < 1 for s in scores)
    mine = pair_model.score(QUERY, DOCUMENTS)
    for x in results:  # the served scores are the pair model's probabilities, document by document
        assert abs(x["relevance_score"] - float(mine[x["index"]])) < 1e-5, x
    tokens = sum(pair_model.token_counts([QUERY] * len(DOCUMENTS), DOCUMENTS))
    assert body["usage"] == {"prompt_tokens": tokens, "total_tokens": tokens}


def test_top_n_keeps_the_best_and_return_documents_false_leaves_the_texts_out(doors):
    whole = _post(doors.open, "/v1/rerank", {"query": QUERY, "documents": DOCUMENTS}).json()["results"]
    top = _post(doors.open, "/v1/rerank", {"query": QUERY, "documents": DOCUMENTS, "top_n": 2}).json()["results"]
    assert top == whole[:2]
    bare = _post(doors.open, "/v1/rerank", {"query": QUERY, "documents": [{"text": d} for d in DOCUMENTS],
                                             "return_documents": False}).json()["results"]
    assert bare == [{"index": x["index"], "relevance_score": x["relevance_score"]} for x in whole]


def test_the_three_rerank_paths_answer_the_same(doors):
    answers = [_post(doors.open, path, {"model": RERANKER, "query": QUERY, "documents": DOCUMENTS, "top_n": 3})
               for path in RERANK_PATHS]
    assert [a.status_code for a in answers] == [200, 200, 200]
    bodies = [{k: v for k, v in a.json().items() if k != "id"} for a in answers]
    assert bodies[0] == bodies[1] == bodies[2] and len(bodies[0]["results"]) == 3


def test_score_gives_a_duplicate_more_than_a_look_alike_pairing_one_to_many_and_pairwise(doors):
    # A held-out source of the hand-written chat pairs (ops/data/chat_pairs_test.jsonl): its rewording, its look-alike.
    question, rewording, lookalike = ("What is the capital of Portugal?", "Portugal's capital is which city?",
                                      "What is the currency of Portugal?")
    r = _post(doors.open, "/v1/score", {"text_1": question, "text_2": [rewording, lookalike]})
    body = r.json()
    assert r.status_code == 200, body
    assert (body["object"], body["model"]) == ("list", RERANKER) and body["id"].startswith("score-")
    assert [d["index"] for d in body["data"]] == [0, 1] and {d["object"] for d in body["data"]} == {"score"}
    duplicate, other = (d["score"] for d in body["data"])
    assert duplicate > other
    assert body["usage"]["prompt_tokens"] == body["usage"]["total_tokens"] > 0
    pairwise = _post(doors.open, "/score", {"text_1": [question, question], "text_2": [rewording, lookalike]}).json()
    assert [d["score"] for d in pairwise["data"]] == [duplicate, other]
    ranked = _post(doors.open, "/v1/rerank", {"query": question, "documents": [rewording, lookalike]}).json()
    assert [x["relevance_score"] for x in ranked["results"]] == [duplicate, other]


def test_the_embedding_model_scores_by_the_cosine_of_its_own_vectors(doors):
    r = _post(doors.open, "/v1/score", {"model": EMBEDDER, "text_1": QUERY, "text_2": DOCUMENTS})
    body = r.json()
    assert r.status_code == 200 and body["model"] == EMBEDDER, body
    vectors = _post(doors.open, "/v1/embeddings", {"model": EMBEDDER, "input": [QUERY, *DOCUMENTS],
                                                   "encoding_format": "float"}).json()["data"]
    query = np.array(vectors[0]["embedding"])
    for d in body["data"]:
        assert abs(d["score"] - float(query @ np.array(vectors[d["index"] + 1]["embedding"]))) < 1e-5, d
    ranked = _post(doors.open, "/v2/rerank", {"model": f"sentence-transformers/{EMBEDDER}", "query": QUERY,
                                              "documents": DOCUMENTS}).json()
    assert ranked["model"] == EMBEDDER and ranked["results"][0]["index"] == PARAPHRASE


@pytest.mark.parametrize("path, body, status, code, param", [
    ("/v1/rerank", {"model": "bge-reranker-base", "query": "q", "documents": ["a"]}, 404, "model_not_found", "model"),
    ("/v1/rerank", {"documents": ["a"]}, 400, "missing_field", "query"),
    ("/rerank", {"query": "q", "documents": []}, 400, "invalid_field", "documents"),
    ("/v2/rerank", {"query": "q", "documents": ["a"], "top_n": -2}, 400, "invalid_field", "top_n"),
    ("/v1/rerank", {"query": "q", "documents": ["a"], "max_chunks_per_doc": 3}, 400, "unknown_field",
     "max_chunks_per_doc"),
    ("/v1/rerank", {"query": "q", "documents": ["a"], "truncate_prompt_tokens": 16}, 400, "unsupported_field",
     "truncate_prompt_tokens"),
    ("/v1/score", {"text_1": ["a", "b"], "text_2": ["c", "d", "e"]}, 400, "invalid_field", "text_2"),
    ("/v1/score", {"text_1": "a"}, 400, "missing_field", "text_2"),
    ("/score", {"queries": "a", "items": ["b"]}, 400, "unsupported_field", "items"),
])
def test_bad_rerank_and_score_bodies_are_refused_naming_the_field(doors, path, body, status, code, param):
    r = _post(doors.open, path, body)
    error = r.json()["error"]
    assert (r.status_code, error["code"], error["param"]) == (status, code, param), error
    assert error["type"] == "invalid_request_error"


def test_a_body_that_is_not_json_is_invalid_json(doors):
    r = httpx.post(f"http://127.0.0.1:{doors.open}/v1/score", content=b"{text_1", timeout=10)
    assert (r.status_code, r.json()["error"]["code"]) == (400, "invalid_json")


def test_rerank_and_score_need_a_good_key_where_keys_are_on(doors):
    for path, body in (("/v1/rerank", {"query": QUERY, "documents": DOCUMENTS}),
                       ("/v1/score", {"text_1": QUERY, "text_2": DOCUMENTS[0]})):
        for key in (None, doors.key + "x"):
            r = _post(doors.strict, path, body, key)
            assert (path, r.status_code, r.json()["error"]["code"]) == (path, 401, "unauthorized")
        assert _post(doors.strict, path, body, doors.key).status_code == 200, path


def test_a_gateway_without_the_cache_says_rerank_and_score_need_it(doors):
    for path, body in (("/v1/rerank", {"query": "q", "documents": ["a"]}), ("/v1/score", {"text_1": "q", "text_2": "a"})):
        r = _post(doors.full, path, body)
        assert (r.status_code, r.json()["error"]["code"]) == (503, "unavailable"), r.json()
        assert "BRIGADE_CACHE_ENABLED=true" in r.json()["error"]["message"]


def test_a_rerank_counts_against_its_keys_limits_and_usage(doors):
    key = create_key(doors.store_url, rpm=2)
    served = [_post(doors.strict, "/v1/rerank", {"query": QUERY, "documents": DOCUMENTS[:2]}, key),
              _post(doors.strict, "/v1/score", {"text_1": QUERY, "text_2": DOCUMENTS[2]}, key)]
    assert [r.status_code for r in served] == [200, 200]
    refused = _post(doors.strict, "/v1/rerank", {"query": QUERY, "documents": ["one more"]}, key)
    assert (refused.status_code, refused.json()["error"]["code"]) == (429, "rate_limited")
    assert "2 requests" in refused.json()["error"]["message"] and refused.headers["Retry-After"]

    async def usage():
        async with async_client(doors.store_url) as r:
            return await KeyStore(r).usage(key.split("_")[1])

    wait_until(lambda: asyncio.run(usage())["requests"] == 2, 10, what="both requests' usage")
    charged = sum(r.json()["usage"]["total_tokens"] for r in served)
    wait_until(lambda: asyncio.run(usage())["prompt_tokens"] == charged, 10, what="their tokens charged")


def test_rerank_and_score_requests_are_counted_in_the_gateways_metrics(doors):
    before = _scrape(doors.open)
    _post(doors.open, "/rerank", {"query": f"a query {time.monotonic_ns()}", "documents": DOCUMENTS})
    _post(doors.open, "/v1/score", {"model": EMBEDDER, "text_1": "a", "text_2": ["b", "c"]})
    _post(doors.open, "/v1/rerank", {"query": "q", "documents": ["a"], "colour": "blue"})
    after = _scrape(doors.open)

    def delta(name, **labels):
        return _value(after, name, **labels) - _value(before, name, **labels)

    reranker = {"model": RERANKER, "api": "rerank"}
    assert delta("brigade_rerank_requests_total", outcome="served", **reranker) == 1
    assert delta("brigade_rerank_pairs_total", outcome="served", **reranker) == len(DOCUMENTS)
    assert delta("brigade_rerank_requests_total", outcome="refused", **reranker) == 1
    assert delta("brigade_rerank_request_seconds_count", **reranker) == 1
    assert delta("brigade_rerank_request_seconds_sum", **reranker) > 0
    cosine = {"model": EMBEDDER, "api": "score"}
    assert delta("brigade_rerank_requests_total", outcome="served", **cosine) == 1
    assert delta("brigade_rerank_pairs_total", outcome="served", **cosine) == 2


def test_models_lists_the_chat_model_first_then_the_embedding_model_and_the_reranker_with_their_kinds(doors):
    cards = httpx.get(f"http://127.0.0.1:{doors.open}/v1/models", timeout=10).json()["data"]
    assert [(c["id"], c["kind"]) for c in cards] == [(MODEL, "generate"), (EMBEDDER, "embedding"),
                                                     (RERANKER, "rerank")]
    assert all(c["object"] == "model" and c["owned_by"] == "brigade" and isinstance(c["created"], int) for c in cards)
    embedding, reranker = cards[1], cards[2]
    assert (embedding["max_model_len"], embedding["dimensions"]) == (256, 384)
    assert "/v1/embeddings" in embedding["endpoints"] and "/v1/rerank" in reranker["endpoints"]
    assert reranker["max_model_len"] == 128
    # Without the cache, neither model is held, so neither is listed.
    bare = httpx.get(f"http://127.0.0.1:{doors.full}/v1/models", timeout=10).json()["data"]
    assert [(c["id"], c["kind"]) for c in bare] == [(MODEL, "generate")]
