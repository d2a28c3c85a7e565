"""Model generation defaults and cache hits, on real processes: a real redis-server, one real
`brigade worker` with the default model, two real gateways.

- `model`: the shipped defaults of the default model (temperature 0.2, top_p 0.9, max_tokens 256);
- `pinned`: BRIGADE_DEFAULT_MAX_TOKENS=3 and BRIGADE_DEFAULT_TEMPERATURE=0, which win over the model's.

What a request leaves unset is filled at the gateway, so it shows in the exact-cache key (a
request that spells the defaults out hits the entry an unset one stored), in what is cached at all
(a sampled default fills a pool of answers, then is served from it) and in the answer's length."""
from __future__ import annotations

import asyncio
import json
import re
import time

import httpx
import openai
import pytest
from websockets.asyncio.client import connect

from ops.core import redis_keys
from tests.clients import ask
from tests.services import Stack, wait_until

MODEL = "smollm2-135m-instruct"
COUNT = "Count from 1 to 1000, separated by commas."  # never ends by itself: every answer is cut
SERVER_ID = re.compile(r"^[0-9a-f]{32}$")


class DefaultsStack(Stack):
    @property
    def model(self) -> int:
        return self.gateways["model"].port

    @property
    def pinned(self) -> int:
        return self.gateways["pinned"].port

    def client(self, port: int) -> openai.OpenAI:
        return openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="none", max_retries=0, timeout=180)

    def ws(self, port: int) -> str:
        return f"ws://127.0.0.1:{port}/v1/ws"

    def entries(self) -> int:
        return self.redis.client.zcard(redis_keys.CACHE_LRU)


@pytest.fixture(scope="module")
def stack(redis_server, model_dir, tmp_path_factory):
    redis_server.client.flushdb()
    with DefaultsStack(redis_server, tmp_path_factory.mktemp("defaults-logs"), BRIGADE_WORKER_CONCURRENCY="8",
                       BRIGADE_MAX_WAIT_MS="20", BRIGADE_BATCH_POLL_S="0.2") as s:
        # The model's own defaults: the test stacks' greedy pin (tests/services.py) removed. Batch
        # jobs go to whichever gateway takes their lease first: this one looks only at its start,
        # so that the batch test's job runs on `pinned`, with its defaults.
        s.start_gateway("model", BRIGADE_DEFAULT_TEMPERATURE=None, BRIGADE_BATCH_POLL_S="3600",
                        BRIGADE_CACHE_SAMPLES="2")
        # Every semantic hit here is audited: asked again of the model in the batch lane.
        s.start_gateway("pinned", BRIGADE_DEFAULT_MAX_TOKENS="3", BRIGADE_DEFAULT_TEMPERATURE="0",
                        BRIGADE_CACHE_AUDIT_SHARE="1")
        s.start_worker("w1@defaults")
        s.wait_ready()
        yield s


def stored_after(stack: DefaultsStack, before: int, n: int = 1) -> None:
    """The gateway stores an answer after its `done`: wait until it is in Redis."""
    wait_until(lambda: stack.entries() >= before + n, 30, what="the answer stored in the cache")


def ws_ask(stack: DefaultsStack, port: int, client_id: str, **fields):
    return asyncio.run(ask(stack.ws(port), client_id, **fields))


# ---- generation defaults ---------------------------------------------------------------------------


def test_the_gateway_lists_the_defaults_it_fills_in(stack):
    model = httpx.get(f"http://127.0.0.1:{stack.model}/v1/models", timeout=10).json()["data"][0]
    pinned = httpx.get(f"http://127.0.0.1:{stack.pinned}/v1/models", timeout=10).json()["data"][0]
    assert model["sampling_defaults"] == {"max_tokens": 256, "temperature": 0.2, "top_p": 0.9, "top_k": 0,
                                          "repetition_penalty": 1.0}
    assert (pinned["sampling_defaults"]["max_tokens"], pinned["sampling_defaults"]["temperature"]) == (3, 0.0)


def test_an_unset_max_tokens_is_the_models_256_in_the_exact_cache_key(stack):
    question = "What is the capital of Spain?"
    before = stack.entries()
    first = ws_ask(stack, stack.model, "unset", messages=[{"role": "user", "content": question}], temperature=0)
    assert first.end["type"] == "done" and first.end.get("cached") is None, first.end
    assert first.end["usage"]["completion_tokens"] <= 256
    stored_after(stack, before)
    spelled = ws_ask(stack, stack.model, "spelled", messages=[{"role": "user", "content": question}], temperature=0,
                     max_tokens=256, top_p=0.9, top_k=0, repetition_penalty=1.0)
    other = ws_ask(stack, stack.model, "other", messages=[{"role": "user", "content": question}], temperature=0,
                   max_tokens=255, cache="exact")
    assert spelled.end.get("cached") == "exact" and spelled.text == first.text
    assert other.end.get("cached") is None  # a different max_tokens is a different request
    stored_after(stack, before, 2)  # `other` is stored too: the next test counts from here


def sampled_entry(stack: DefaultsStack, question: str) -> str | None:
    for entry_id in stack.redis.client.zrange(redis_keys.CACHE_LRU, 0, -1):
        fields = stack.redis.client.hmget(redis_keys.cache_entry(entry_id), ["question", "sampled"])
        if fields == [question, "1"]:
            return entry_id
    return None


def test_an_unset_temperature_samples_at_the_models_0_2_and_a_repeat_is_served_from_a_pool_of_k(stack):
    text = "Name a color of the rainbow."
    question = [{"role": "user", "content": text}]
    generated = set()

    def served_from_pool(i: int) -> bool:
        answer = ws_ask(stack, stack.model, f"sampled-{i}", messages=question, max_tokens=6)
        assert answer.end["type"] == "done", answer.end
        if answer.end.get("cached") is None:
            generated.add(answer.text)
        return answer.end.get("cached") == "exact"

    # The pool (BRIGADE_CACHE_SAMPLES=2 here) fills from the model first: the first two are generated.
    assert not served_from_pool(0) and not served_from_pool(1)
    asked = iter(range(2, 100))
    wait_until(lambda: served_from_pool(next(asked)), 60, what="the pool full and served")
    served = [ws_ask(stack, stack.model, f"again-{i}", messages=question, max_tokens=6) for i in range(6)]
    assert all(a.end.get("cached") == "exact" and a.text in generated for a in served), [a.end for a in served]
    entry_id = sampled_entry(stack, text)
    assert entry_id is not None and stack.redis.client.llen(redis_keys.cache_samples(entry_id)) == 2
    assert 0 < stack.redis.client.ttl(redis_keys.cache_samples(entry_id)) <= 86_400
    # A seeded request has one answer, stored once, as before.
    before = stack.entries()
    seeded = ws_ask(stack, stack.model, "seeded", messages=question, max_tokens=6, seed=11)
    stored_after(stack, before)
    spelled = ws_ask(stack, stack.model, "spelled", messages=question, max_tokens=6, seed=11, temperature=0.2,
                     top_p=0.9)
    hotter = ws_ask(stack, stack.model, "hotter", messages=question, max_tokens=6, seed=11, temperature=0.7,
                    top_p=0.9, cache="exact")
    assert spelled.end.get("cached") == "exact" and spelled.text == seeded.text
    assert hotter.end.get("cached") is None
    stored_after(stack, before, 2)  # `hotter` (seeded) is stored too: the next test counts from here


def test_the_settings_override_wins_over_the_model_and_an_explicit_field_wins_over_both(stack):
    client = stack.client(stack.pinned)
    chat = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": COUNT}],
                                          extra_body={"cache": "off"})
    completion = client.completions.create(model=MODEL, prompt="1, 2, 3, 4,", extra_body={"cache": "off"})
    ws = ws_ask(stack, stack.pinned, "ws", prompt=COUNT, cache="off")
    explicit = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": COUNT}],
                                              max_tokens=5, extra_body={"cache": "off"})
    assert (chat.usage.completion_tokens, chat.choices[0].finish_reason) == (3, "length")
    assert (completion.usage.completion_tokens, completion.choices[0].finish_reason) == (3, "length")
    assert (ws.end["usage"]["completion_tokens"], ws.end["finish_reason"]) == (3, "length")
    assert explicit.usage.completion_tokens == 5
    # The model's own max_tokens (256) on the other gateway: the override is this gateway's alone.
    longer = stack.client(stack.model).chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": COUNT}], temperature=0, max_tokens=8,
        extra_body={"cache": "off"})
    assert longer.usage.completion_tokens == 8


def test_the_override_temperature_0_makes_unset_requests_greedy_and_cached(stack):
    question = [{"role": "user", "content": "Name a planet."}]
    before = stack.entries()
    first = ws_ask(stack, stack.pinned, "g1", messages=question)
    stored_after(stack, before)
    again = ws_ask(stack, stack.pinned, "g2", messages=question)
    assert first.end.get("cached") is None and again.end.get("cached") == "exact"


def test_a_batch_line_without_max_tokens_gets_the_same_default_as_the_doors(stack, tmp_path):
    client = stack.client(stack.pinned)
    source = tmp_path / "lines.jsonl"
    source.write_text("\n".join(json.dumps({"custom_id": f"c{i}", "method": "POST", "url": "/v1/chat/completions",
                                            "body": {"model": MODEL, "messages": [{"role": "user", "content": COUNT}],
                                                     "cache": "off"}}) for i in range(2)) + "\n")
    uploaded = client.files.create(file=source.open("rb"), purpose="batch")
    batch = client.batches.create(input_file_id=uploaded.id, endpoint="/v1/chat/completions", completion_window="24h")
    deadline = time.monotonic() + 180
    while batch.status not in ("completed", "failed", "cancelled", "expired"):
        assert time.monotonic() < deadline, batch
        time.sleep(0.3)
        batch = client.batches.retrieve(batch.id)
    assert batch.status == "completed", batch
    lines = [json.loads(x) for x in client.files.content(batch.output_file_id).text.splitlines()]
    assert [x["response"]["body"]["usage"]["completion_tokens"] for x in lines] == [3, 3]


# ---- cache hits: a request id, and cut answers that serve rewordings ------------------------------------


def test_a_cache_hit_has_its_own_request_id_on_every_door(stack):
    client = stack.client(stack.pinned)
    body = dict(model=MODEL, messages=[{"role": "user", "content": "What is the capital of Italy?"}], max_tokens=4)
    before = stack.entries()
    first = client.chat.completions.with_raw_response.create(**body)
    stored_after(stack, before)
    hit = client.chat.completions.with_raw_response.create(**body)
    streamed = list(client.chat.completions.create(**body, stream=True))
    miss_extra, hit_extra = first.parse().model_extra["brigade"], hit.parse().model_extra["brigade"]
    assert miss_extra["cached"] is None and hit_extra["cached"] == "exact"
    assert SERVER_ID.match(hit_extra["request_id"] or ""), hit_extra
    assert hit_extra["request_id"] == hit.headers["x-request-id"] != miss_extra["request_id"]
    last = [c.model_extra.get("brigade") for c in streamed if c.model_extra.get("brigade")][-1]
    assert last["cached"] == "exact" and SERVER_ID.match(last["request_id"] or "")
    assert last["request_id"] != hit_extra["request_id"]  # each hit is its own request

    async def ws_hit() -> list[dict]:
        async with connect(stack.ws(stack.pinned)) as ws:
            await ws.send(json.dumps({"type": "generate", "id": "h", "messages": body["messages"], "max_tokens": 4}))
            events = []
            while not events or events[-1]["type"] not in ("done", "error"):
                events.append(json.loads(await asyncio.wait_for(ws.recv(), 60)))
            return events
    events = asyncio.run(ws_hit())
    assert [e["type"] for e in events] == ["token", "done"] and events[-1]["cached"] == "exact", events
    assert all(SERVER_ID.match(e.get("request_id") or "") for e in events)
    assert events[0]["request_id"] == events[1]["request_id"]


def test_an_answer_cut_by_max_tokens_serves_a_rewording_asked_with_the_same_max_tokens(stack):
    # A rewording the shipped pair model accepts (ops/data/chat_paraphrases.jsonl's eval).
    asked = [{"role": "user", "content": "How do I make cold brew coffee at home?"}]
    reworded = [{"role": "user", "content": "Tell me how to make cold brew coffee at home."}]
    before = stack.entries()
    first = ws_ask(stack, stack.pinned, "cut", messages=asked, max_tokens=12)
    assert first.end["finish_reason"] == "length", first.end  # cut, and a how-to does not loop
    stored_after(stack, before)
    elsewhere = ws_ask(stack, stack.pinned, "longer", messages=reworded, max_tokens=13)
    same = ws_ask(stack, stack.pinned, "same", messages=reworded, max_tokens=12)
    assert same.end.get("cached") == "semantic" and same.text == first.text, same.end
    # Asked for more tokens, the rewording is another request: the cut answer is not served to it.
    assert elsewhere.end.get("cached") is None
    # This gateway audits every semantic hit: the model answers the rewording in the batch lane and
    # the two answers are compared, evidence for the thresholds (cache/evidence.py).
    def audited() -> list[dict]:
        rows = [json.loads(r) for r in stack.redis.client.lrange(redis_keys.CACHE_EVIDENCE, 0, -1)]
        return [r for r in rows if r["source"] == "audit" and r["entry"] == same.end["entry"]]

    wait_until(audited, 120, what="the audit of the semantic hit")
    assert abs(audited()[0]["cosine"] - same.end["similarity"]) < 1e-3
    assert 0 < stack.redis.client.ttl(redis_keys.CACHE_EVIDENCE) <= 86_400
