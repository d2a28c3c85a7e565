"""vLLM's and OpenAI's further endpoints on the OpenAI-door stack (tests/test_openai_api.py, which
imports these tests so that they run on its one module-scoped stack instead of starting another):
/health and /ping, /version, /tokenize and /detokenize, /v1/embeddings (through the official
`openai` client). The `doors` fixture is that module's. Not collected on its own (no test_ prefix)."""
from __future__ import annotations

import asyncio
import base64
import math
import time
from importlib import metadata

import httpx
import numpy as np
import openai
import pytest

from gateway.admission.api_keys import KeyStore
from ops.core.redis_clients import async_client
from tests.openai_doors import MODEL, _scrape, _value
from tests.services import create_key, wait_until

EMBEDDER = "all-MiniLM-L6-v2"
TEXTS = ["How do I reset my password?", "I forgot my password, how can I change it?", "The cat sat on the mat."]


def _post(port: int, path: str, body: dict, key: str | None = None) -> httpx.Response:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    return httpx.post(f"http://127.0.0.1:{port}{path}", json=body, headers=headers, timeout=60)


def test_health_and_ping_are_200_with_an_empty_body_without_a_key(doors):
    for path, method in (("/health", "GET"), ("/ping", "GET"), ("/ping", "POST")):
        r = httpx.request(method, f"http://127.0.0.1:{doors.strict}{path}", timeout=10)
        assert (path, method, r.status_code, r.content) == (path, method, 200, b"")
    # Redis answers but no worker serves this database: ready to queue, so healthy (not /readyz)
    assert httpx.get(f"http://127.0.0.1:{doors.empty}/health", timeout=10).status_code == 200
    assert httpx.get(f"http://127.0.0.1:{doors.empty}/readyz", timeout=10).status_code == 503


def test_version_is_the_installed_packages(doors):
    r = httpx.get(f"http://127.0.0.1:{doors.strict}/version", timeout=10)
    assert r.status_code == 200 and r.json() == {"version": metadata.version("brigade")}


def test_tokenized_messages_count_what_a_chat_answer_charges_and_detokenize_to_the_template(doors, renderer):
    messages = [{"role": "system", "content": "Answer briefly."}, {"role": "user", "content": "Name a planet."}]
    answer = doors.client(doors.open).chat.completions.create(model=MODEL, messages=messages, max_tokens=1,
                                                              extra_body={"cache": "off"})
    r = _post(doors.open, "/tokenize", {"model": MODEL, "messages": messages, "return_token_strs": True})
    body = r.json()
    assert r.status_code == 200, body
    assert body["count"] == len(body["tokens"]) == answer.usage.prompt_tokens > 10
    assert body["max_model_len"] == 8192 and len(body["token_strs"]) == body["count"]
    text = _post(doors.open, "/detokenize", {"model": MODEL, "tokens": body["tokens"]}).json()["prompt"]
    assert text == renderer.render(messages) and text.endswith("assistant\n")
    bare = _post(doors.open, "/tokenize", {"messages": messages, "add_generation_prompt": False}).json()
    assert bare["count"] < body["count"] and bare["token_strs"] is None


def test_tokenized_messages_with_tools_count_what_a_chat_with_those_tools_charges(doors):
    messages = [{"role": "user", "content": "What is the weather in Paris?"}]
    tools = [{"type": "function", "function": {"name": "get_weather", "description": "The weather in a city",
                                               "parameters": {"type": "object",
                                                              "properties": {"city": {"type": "string"}}}}}]
    answer = doors.client(doors.open).chat.completions.create(model=MODEL, messages=messages, tools=tools,
                                                              max_tokens=1, extra_body={"cache": "off"})
    with_tools = _post(doors.open, "/tokenize", {"messages": messages, "tools": tools}).json()
    without = _post(doors.open, "/tokenize", {"messages": messages}).json()
    assert with_tools["count"] == answer.usage.prompt_tokens > without["count"]


def test_a_tokenized_prompt_detokenizes_to_itself(doors):
    prompt = "The capital of France is Paris. Ünïcode too: 東京"
    body = _post(doors.open, "/tokenize", {"prompt": prompt}).json()
    assert body["count"] == len(body["tokens"]) > 5
    assert _post(doors.open, "/detokenize", {"tokens": body["tokens"]}).json() == {"prompt": prompt}


@pytest.mark.parametrize("path, body, status, code, param", [
    ("/tokenize", {"model": "gpt-17", "prompt": "hi"}, 404, "model_not_found", "model"),
    ("/tokenize", {"prompt": "hi", "colour": "blue"}, 400, "unknown_field", "colour"),
    ("/tokenize", {}, 400, "missing_field", "prompt"),
    ("/tokenize", {"prompt": "hi", "add_special_tokens": "yes"}, 400, "invalid_field", "add_special_tokens"),
    ("/detokenize", {"tokens": [1, 2, 10**9]}, 400, "invalid_field", "tokens"),
    ("/detokenize", {"tokens": [-1]}, 400, "invalid_field", "tokens"),
    ("/detokenize", {"tokens": "1 2"}, 400, "invalid_field", "tokens"),
    ("/detokenize", {}, 400, "missing_field", "tokens"),
])
def test_bad_tokenize_bodies_get_stable_codes(doors, path, body, status, code, param):
    r = _post(doors.open, path, body)
    assert (r.status_code, r.json()["error"]["code"], r.json()["error"]["param"]) == (status, code, param), r.json()


def test_tokenize_and_embeddings_need_a_good_key_where_keys_are_on(doors):
    for path, body in (("/tokenize", {"prompt": "hi"}), ("/detokenize", {"tokens": [1]}),
                       ("/v1/embeddings", {"model": EMBEDDER, "input": "hi"})):
        for key in (None, doors.key + "x"):
            r = _post(doors.strict, path, body, key)
            assert (path, r.status_code, r.json()["error"]["code"]) == (path, 401, "unauthorized")
        assert _post(doors.strict, path, body, doors.key).status_code == 200, path
    with pytest.raises(openai.AuthenticationError):
        doors.client(doors.strict, "brg_00000000_" + "x" * 32).embeddings.create(model=EMBEDDER, input="hi")


def _cosine(a, b) -> float:
    return float(np.dot(a, b) / (np.linalg.norm(a) * np.linalg.norm(b)))


def test_embeddings_are_the_caches_vectors_in_order_as_floats_or_base64(doors, embedder):
    client = doors.client(doors.open)
    floats = client.embeddings.create(model=EMBEDDER, input=TEXTS, encoding_format="float")
    assert floats.object == "list" and floats.model == EMBEDDER
    assert [d.index for d in floats.data] == [0, 1, 2] and all(len(d.embedding) == 384 for d in floats.data)
    assert floats.usage.prompt_tokens == floats.usage.total_tokens == sum(embedder.token_counts(TEXTS))
    mine = embedder.embed(TEXTS)
    for i, d in enumerate(floats.data):  # order kept: each row is its own text's vector
        assert _cosine(d.embedding, mine[i]) > 0.9999, i
        assert math.isclose(float(np.linalg.norm(d.embedding)), 1.0, abs_tol=1e-5)
    served = _cosine(floats.data[0].embedding, floats.data[1].embedding)
    assert abs(served - float(np.dot(mine[0], mine[1]))) < 1e-5
    assert abs(_cosine(floats.data[0].embedding, floats.data[2].embedding) - float(np.dot(mine[0], mine[2]))) < 1e-5
    # The client's default asks for base64 and decodes it: the same float32 numbers.
    packed = client.embeddings.create(model=EMBEDDER, input=TEXTS)
    assert [d.embedding for d in packed.data] == [d.embedding for d in floats.data]
    raw = _post(doors.open, "/v1/embeddings", {"model": EMBEDDER, "input": TEXTS, "encoding_format": "base64"})
    decoded = np.frombuffer(base64.b64decode(raw.json()["data"][2]["embedding"]), dtype="<f4")
    assert decoded.tolist() == floats.data[2].embedding
    # One text alone is the vector the cache stores for that question (a batch pads, moving the last digits).
    alone = client.embeddings.create(model=EMBEDDER, input=TEXTS[2], encoding_format="float").data[0].embedding
    assert np.max(np.abs(np.array(alone) - embedder.embed_one(TEXTS[2]))) < 1e-6


@pytest.mark.parametrize("extra, status, code, param", [
    ({"dimensions": 128}, 400, "unsupported_field", "dimensions"),
    ({"input": [[1, 2, 3]]}, 400, "unsupported_field", "input"),
    ({"input": []}, 400, "invalid_field", "input"),
    ({"model": "text-embedding-3-small"}, 404, "model_not_found", "model"),
    ({"encoding_format": "int8"}, 400, "invalid_field", "encoding_format"),
])
def test_what_the_embedding_model_cannot_do_is_refused_naming_the_field(doors, extra, status, code, param):
    with pytest.raises(openai.APIStatusError) as err:
        doors.client(doors.open).embeddings.create(**{"model": EMBEDDER, "input": "hi", **extra})
    assert (err.value.status_code, err.value.body["code"], err.value.body["param"]) == (status, code, param)
    if param == "dimensions":
        assert "384 dimensions" in err.value.body["message"]


def test_a_gateway_without_the_cache_says_embeddings_need_it(doors):
    with pytest.raises(openai.APIStatusError) as err:
        doors.client(doors.full).embeddings.create(model=EMBEDDER, input="hi")
    assert err.value.status_code == 503 and err.value.body["code"] == "unavailable"
    assert "BRIGADE_CACHE_ENABLED=true" in err.value.body["message"]


def test_an_embeddings_request_counts_against_its_keys_limits_and_usage(doors):
    key = create_key(doors.store_url, rpm=2)
    client = doors.client(doors.strict, key)
    for _ in range(2):
        client.embeddings.create(model=EMBEDDER, input=TEXTS[:2])
    with pytest.raises(openai.RateLimitError) as err:
        client.embeddings.create(model=EMBEDDER, input="one more")
    assert err.value.body["code"] == "rate_limited" and "2 requests" in err.value.body["message"]

    async def usage():
        async with async_client(doors.store_url) as r:
            return await KeyStore(r).usage(key.split("_")[1])

    wait_until(lambda: asyncio.run(usage())["requests"] == 2, 10, what="both embedding requests' usage")
    assert asyncio.run(usage())["prompt_tokens"] > 0


def test_embedding_requests_are_counted_in_the_gateways_metrics(doors):
    before = _scrape(doors.open)
    client = doors.client(doors.open)
    client.embeddings.create(model=EMBEDDER, input=[f"a text {time.monotonic_ns()}", "another"])
    with pytest.raises(openai.BadRequestError):
        client.embeddings.create(model=EMBEDDER, input="hi", dimensions=3)
    after = _scrape(doors.open)

    def delta(name, **labels):
        return _value(after, name, model=EMBEDDER, **labels) - _value(before, name, model=EMBEDDER, **labels)

    assert delta("brigade_embedding_requests_total", outcome="served") == 1
    assert delta("brigade_embedding_inputs_total", outcome="served") == 2
    assert delta("brigade_embedding_requests_total", outcome="refused") == 1
    assert delta("brigade_embedding_request_seconds_count") == 1
    assert delta("brigade_embedding_request_seconds_sum") > 0


def test_responses_need_a_good_key_count_against_its_limits_and_belong_to_it(doors):
    owner, other, limited = (create_key(doors.store_url), create_key(doors.store_url),
                             create_key(doors.store_url, rpm=1))
    body = {"model": MODEL, "input": "Name a colour.", "max_output_tokens": 4, "temperature": 0}
    for key in (None, owner + "x"):
        r = _post(doors.strict, "/v1/responses", body, key)
        assert (r.status_code, r.json()["error"]["code"]) == (401, "unauthorized")
    made = doors.client(doors.strict, owner).responses.create(**body)
    assert doors.client(doors.strict, owner).responses.retrieve(made.id).output_text == made.output_text
    with pytest.raises(openai.NotFoundError):  # another key's response does not exist for this one
        doors.client(doors.strict, other).responses.retrieve(made.id)
    with pytest.raises(openai.NotFoundError):
        doors.client(doors.strict, other).responses.create(**body, previous_response_id=made.id)
    doors.client(doors.strict, limited).responses.create(**body)
    with pytest.raises(openai.RateLimitError) as limit:  # the key's requests per minute, as for chat
        doors.client(doors.strict, limited).responses.create(**body)
    assert limit.value.body["code"] == "rate_limited"
