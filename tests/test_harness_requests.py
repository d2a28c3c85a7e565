"""What evaluation harnesses ask of the OpenAI door, against real processes: a real redis-server,
one real `brigade worker`, a real gateway (and one that requires keys), the tiny model (what is
checked is mechanics: the same scores by two paths, order, numbering, refusals).

- Several prompts in one /v1/completions body: each a request of its own through admission,
  answered in prompt order, each as it is answered alone, choices numbered prompt * n + choice,
  usage summed; one refusal refuses the whole request and frees what was admitted; not streamed.
- `max_tokens: 0` with `echo`: the prompt and its scores, no token, in a body and in a stream.
- /tokenizer_info in vLLM's shape, which lm-evaluation-harness's remote tokenizer detects and reads.
The whole harness against the real model: tests/test_eval_harness.py."""
from __future__ import annotations

import json

import httpx
import pytest

from tests.services import Stack, create_key, wait_until, worker_statuses

MODEL = "smollm2-135m-instruct"
PROMPTS = ["The capital of France is", "One, two, three,", "Once upon a time", "Water boils at"]


@pytest.fixture(scope="module")
def stack(redis_server, tiny_model_dir, tmp_path_factory):
    redis_server.client.flushdb()
    with Stack(redis_server, tmp_path_factory.mktemp("harness-logs"), BRIGADE_MODEL=str(tiny_model_dir),
               BRIGADE_CACHE_ENABLED="0", BRIGADE_TORCH_THREADS="1",
               BRIGADE_MAX_WAIT_MS="20", BRIGADE_WORKER_CONCURRENCY="16") as s:
        s.start_gateway()
        s.start_gateway("keyed", BRIGADE_AUTH="required")
        s.start_worker("w1@harness")
        s.wait_healthy()
        s.wait_ready()
        yield s


def complete(port: int, key: str | None = None, **body) -> httpx.Response:
    headers = {"authorization": f"Bearer {key}"} if key else {}
    return httpx.post(f"http://127.0.0.1:{port}/v1/completions", json={"model": MODEL, "temperature": 0, **body},
                      headers=headers, timeout=120)


def tokens_of(stack: Stack, text: str) -> list[int]:
    reply = httpx.post(f"{stack.http}/tokenize", json={"prompt": text}, timeout=30)
    assert reply.status_code == 200, reply.text
    return reply.json()["tokens"]


def test_several_prompts_are_answered_in_prompt_order_each_as_it_is_answered_alone(stack):
    alone = [complete(stack.port, prompt=p, max_tokens=6).json() for p in PROMPTS]
    reply = complete(stack.port, prompt=PROMPTS, max_tokens=6)
    assert reply.status_code == 200, reply.text
    body = reply.json()
    assert [c["index"] for c in body["choices"]] == [0, 1, 2, 3]
    assert [c["text"] for c in body["choices"]] == [a["choices"][0]["text"] for a in alone]
    assert all(a["choices"][0]["text"] for a in alone)  # each answer says something
    for name in ("prompt_tokens", "completion_tokens", "total_tokens"):
        assert body["usage"][name] == sum(a["usage"][name] for a in alone)
    served = [p["request_id"] for p in body["brigade"]["prompts"]]
    assert len(set(served)) == 4 and reply.headers["x-request-id"] == body["id"].removeprefix("cmpl-")


def test_several_token_id_prompts_with_echo_score_as_the_harness_reads_them(stack):
    """lm-evaluation-harness's batch: token-id prompts, echo, logprobs 1, max_tokens 1."""
    ids = [tokens_of(stack, p) for p in PROMPTS]
    harness = {"echo": True, "logprobs": 1, "max_tokens": 1, "seed": 1234}
    alone = [complete(stack.port, prompt=i, **harness).json()["choices"][0] for i in ids]
    reply = complete(stack.port, prompt=ids, **harness)
    assert reply.status_code == 200, reply.text
    choices = reply.json()["choices"]
    assert [c["logprobs"] for c in choices] == [a["logprobs"] for a in alone]
    assert [len(c["logprobs"]["token_logprobs"]) for c in choices] == [len(i) + 1 for i in ids]


def test_choices_of_several_prompts_are_numbered_prompt_by_prompt(stack):
    reply = complete(stack.port, prompt=PROMPTS[:2], max_tokens=3, n=2, temperature=1.0, seed=7)
    assert reply.status_code == 200, reply.text
    body = reply.json()
    assert sorted(c["index"] for c in body["choices"]) == [0, 1, 2, 3]
    again = [complete(stack.port, prompt=p, max_tokens=3, n=2, temperature=1.0, seed=7).json() for p in PROMPTS[:2]]
    assert [c["text"] for c in body["choices"]] == [c["text"] for a in again for c in a["choices"]]
    assert body["usage"]["completion_tokens"] == sum(a["usage"]["completion_tokens"] for a in again)


def test_several_prompts_are_not_streamed_and_their_count_is_bounded(stack):
    reply = complete(stack.port, prompt=PROMPTS, max_tokens=2, stream=True)
    assert reply.status_code == 400 and reply.json()["error"]["code"] == "unsupported_field"
    assert reply.json()["error"]["param"] == "stream"
    reply = complete(stack.port, prompt=["Hi"] * 129, max_tokens=1)  # BRIGADE_MAX_PROMPTS_PER_REQUEST: 128
    assert reply.status_code == 400 and reply.json()["error"]["param"] == "prompt"


def test_one_refused_prompt_refuses_the_request_and_frees_what_was_admitted(stack):
    """A key that may run two requests at once sends three prompts: the third is refused by the
    key's limit, so the request is, and the two admitted are abandoned: their slots are free again."""
    key = create_key(stack.redis.url, max_concurrent=2)
    keyed = stack.gateways["keyed"].port
    reply = complete(keyed, key, prompt=PROMPTS[:3], max_tokens=50, ignore_eos=True)
    assert reply.status_code == 429 and reply.json()["error"]["code"] == "rate_limited", reply.text
    wait_until(lambda: not any(s["requests"] for s in worker_statuses(stack.redis.client)), 30,
               what="the abandoned prompts to leave the worker")
    reply = wait_until(lambda: (r := complete(keyed, key, prompt=PROMPTS[:2], max_tokens=2)).status_code == 200 and r,
                       30, interval=0.5, what="the key's two slots to be free again")
    assert len(reply.json()["choices"]) == 2


def test_max_tokens_0_with_echo_gives_the_prompt_and_its_scores_and_no_token(stack):
    ids = tokens_of(stack, PROMPTS[0])
    one = complete(stack.port, prompt=ids, echo=True, logprobs=2, max_tokens=1).json()["choices"][0]
    reply = complete(stack.port, prompt=ids, echo=True, logprobs=2, max_tokens=0)
    assert reply.status_code == 200, reply.text
    body = reply.json()
    zero = body["choices"][0]
    assert zero["finish_reason"] == "length" and body["usage"]["completion_tokens"] == 0
    assert body["usage"]["prompt_tokens"] == len(ids)
    assert zero["text"] == PROMPTS[0]
    assert {k: v[:len(ids)] for k, v in one["logprobs"].items()} == zero["logprobs"]
    assert len(zero["logprobs"]["token_logprobs"]) == len(ids) and zero["logprobs"]["token_logprobs"][0] is None
    text = complete(stack.port, prompt=PROMPTS[0], echo=True, max_tokens=0).json()["choices"][0]
    assert text["text"] == PROMPTS[0] and text["logprobs"] is None
    with httpx.stream("POST", f"{stack.http}/v1/completions", timeout=120,
                      json={"model": MODEL, "prompt": ids, "echo": True, "logprobs": 2, "max_tokens": 0,
                            "stream": True}) as streamed:
        chunks = [json.loads(line[6:]) for line in streamed.iter_lines()
                  if line.startswith("data: {")]
    pieces = [c for chunk in chunks for c in chunk["choices"]]
    assert "".join(c["text"] for c in pieces) == PROMPTS[0]
    assert [lp for c in pieces if c["logprobs"] for lp in c["logprobs"]["token_logprobs"]] == \
        zero["logprobs"]["token_logprobs"]
    refused = complete(stack.port, prompt=PROMPTS[0], max_tokens=0)
    assert refused.status_code == 400 and refused.json()["error"]["param"] == "max_tokens"


def test_tokenizer_info_is_vllms_shape_and_lm_eval_reads_its_tokenizer_from_it(stack, tiny_model_dir):
    from lm_eval.utils import RemoteTokenizer, check_remote_tokenizer_support
    from transformers import AutoTokenizer

    info = httpx.get(f"{stack.http}/tokenizer_info", timeout=30)
    assert info.status_code == 200, info.text
    info = info.json()
    local = AutoTokenizer.from_pretrained(tiny_model_dir)
    assert (info["eos_token"], info["bos_token"], info["pad_token"]) == (local.eos_token, local.bos_token,
                                                                          local.pad_token)
    assert info["chat_template"] == local.chat_template and info["tokenizer_class"] == type(local).__name__
    assert info["name_or_path"] == MODEL and "vocab_file" not in info
    base = f"{stack.http}/v1/completions"
    assert check_remote_tokenizer_support(base)
    remote = RemoteTokenizer(base)
    assert remote.eos_token_id == local.eos_token_id and remote.bos_token_id == local.bos_token_id
    text = "Question: What is the capital of France?\nAnswer: Paris"
    assert remote.encode(text) == local(text, add_special_tokens=False)["input_ids"]
    assert httpx.get(f"{stack.http}/tokenizer_info", params={"model": "nope"}, timeout=30).status_code == 404
