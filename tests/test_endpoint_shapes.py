"""The utility and embedding endpoints' shapes without a stack: /health's answer when Redis is gone
(a gateway cannot start without Redis, so this is its handler under Starlette's test client), and
the pure body checks of /tokenize and /v1/embeddings. The same endpoints on real processes:
tests/openai_endpoint_cases.py."""
from __future__ import annotations

import base64

import numpy as np
import pytest
from starlette.applications import Starlette
from starlette.routing import Route
from starlette.testclient import TestClient

from gateway.doors.embeddings import encode, parse_embeddings
from gateway.doors.tokenize_door import parse_tokenize
from gateway.doors.utility_routes import UtilityRoutes
from gateway.request import OneModel, ProtocolError, RequestRules
from ops.core.messages import SamplingDefaults
from ops.core.settings import Settings


def _health_client(report: dict) -> TestClient:
    async def readiness() -> dict:
        return report

    routes = UtilityRoutes(readiness)
    return TestClient(Starlette(routes=[Route("/health", routes.health), Route("/version", routes.version)]))


def test_health_is_503_unavailable_with_the_reason_when_redis_is_gone():
    r = _health_client({"ready": False, "redis": False, "workers": 0, "reason": "redis unreachable: refused"}).get(
        "/health")
    assert r.status_code == 503
    assert r.json()["error"]["code"] == "unavailable" and "redis unreachable: refused" in r.json()["error"]["message"]


def test_health_is_200_and_empty_when_redis_answers_even_before_a_worker_beats():
    r = _health_client({"ready": False, "redis": True, "workers": 0, "reason": "no worker is alive"}).get("/health")
    assert (r.status_code, r.content) == (200, b"")


@pytest.fixture
def protocol() -> RequestRules:
    defaults = SamplingDefaults(max_tokens=16, temperature=0, top_p=1, top_k=0, repetition_penalty=1)
    return RequestRules(Settings(), OneModel(Settings(), defaults))


def test_tokenize_defaults_follow_vllm_special_tokens_for_prompts_not_for_messages(protocol):
    prompt = parse_tokenize({"prompt": "hi"}, protocol)
    chat = parse_tokenize({"messages": [{"role": "developer", "content": "Be brief."},
                                        {"role": "user", "content": [{"type": "text", "text": "hi"}]}]}, protocol)
    assert (prompt.add_special_tokens, prompt.messages, prompt.return_token_strs) == (True, None, False)
    assert chat.add_special_tokens is False and chat.add_generation_prompt is True
    # the chat door's translation: developer is system, text parts are joined; dumped as the worker renders
    assert [(m["role"], m["content"]) for m in chat.messages] == [("system", "Be brief."), ("user", "hi")]


@pytest.mark.parametrize("body, code, field", [
    ({"prompt": "hi", "messages": [{"role": "user", "content": "hi"}]}, "missing_field", "prompt"),
    ({"prompt": "hi", "tools": [{"type": "function"}]}, "invalid_field", "tools"),
    ({"prompt": "x" * 70_000}, "prompt_too_long", "prompt"),
    ([1, 2], "invalid_message", None),
])
def test_bad_tokenize_bodies_name_their_field(protocol, body, code, field):
    with pytest.raises(ProtocolError) as err:
        parse_tokenize(body, protocol)
    assert (err.value.code, err.value.field) == (code, field)


@pytest.mark.parametrize("body, code, field", [
    ({"input": "hi"}, "missing_field", "model"),
    ({"model": "all-MiniLM-L6-v2"}, "missing_field", "input"),
    ({"model": "all-MiniLM-L6-v2", "input": [1, 2]}, "unsupported_field", "input"),
    ({"model": "all-MiniLM-L6-v2", "input": ["a", ""]}, "invalid_field", "input"),
    ({"model": "all-MiniLM-L6-v2", "input": ["a"] * 3}, "invalid_field", "input"),
    ({"model": "all-MiniLM-L6-v2", "input": "a" * 11}, "prompt_too_long", "input"),
    ({"model": "all-MiniLM-L6-v2", "input": "a", "dimensions": 256}, "unsupported_field", "dimensions"),
    ({"model": "all-MiniLM-L6-v2", "input": "a", "colour": 1}, "unknown_field", "colour"),
])
def test_bad_embedding_bodies_name_their_field(body, code, field):
    settings = Settings(embedding_max_inputs=2, embedding_max_input_chars=10)
    with pytest.raises(ProtocolError) as err:
        parse_embeddings(body, "all-MiniLM-L6-v2", 384, settings)
    assert (err.value.code, err.value.field) == (code, field)


def test_an_embedding_request_takes_the_hugging_face_name_and_its_own_dimension_count():
    ask = parse_embeddings({"model": "sentence-transformers/all-MiniLM-L6-v2", "input": "a", "dimensions": 384,
                            "encoding_format": "base64"}, "all-MiniLM-L6-v2", 384, Settings())
    assert ask.inputs == ["a"] and ask.base64


def test_base64_is_little_endian_float32_of_the_same_numbers():
    vector = np.array([0.1, -2.5, 3e-8], dtype=np.float32)
    decoded = np.frombuffer(base64.b64decode(encode(vector, True)), dtype="<f4")
    assert decoded.tolist() == encode(vector, False) == vector.tolist()
