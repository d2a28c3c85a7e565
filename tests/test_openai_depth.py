"""The OpenAI door at vLLM's depth against real processes: a real redis-server, one real `brigade
worker` with the default model, one real gateway, driven by the official `openai` client and by
LangChain's `ChatOpenAI`. Logprobs are checked against the engine's own scores of the same tokens
(the session's real engine in this process); answers against what each field promises. On the
same stack, the WebSocket protocol's own frames with the same fields (n, logprobs, a guide, a
resume), and a worker taking over an n > 1 request whose choices had all ended in its log.
The translations alone (no processes): tests/test_openai_fields.py. The Responses API's tests
(tests/openai_responses_cases.py) run on this module's stack too."""
from __future__ import annotations

import asyncio
import json
import time

import httpx
import jsonschema
import openai
import pytest
import torch
from websockets.asyncio.client import connect

from engine import EngineRequest, SamplingParams
from engine.kv_cache import SequenceKV
from engine.sequence import Chunk, Sequence
from ops.core import redis_keys
from tests.openai_responses_cases import *  # noqa: F401,F403  (its tests run on this module's stack)
from tests.services import Stack, queued_params, wait_until, worker_statuses

MODEL = "smollm2-135m-instruct"
QUESTION = [{"role": "user", "content": "What is the capital of France?"}]
PERSON = {"type": "object", "additionalProperties": False, "required": ["name", "age", "colour"],
          "properties": {"name": {"type": "string", "maxLength": 20}, "age": {"type": "integer"},
                         "colour": {"enum": ["red", "green", "blue"]}}}
WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "The weather in a city",
                                            "parameters": {"type": "object", "additionalProperties": False,
                                                           "properties": {"city": {"type": "string", "maxLength": 30}},
                                                           "required": ["city"]}}}


@pytest.fixture(scope="module")
def stack(redis_server, model_dir, tmp_path_factory):
    redis_server.client.flushdb()
    with Stack(redis_server, tmp_path_factory.mktemp("depth-logs"), BRIGADE_WORKER_CONCURRENCY="16",
               BRIGADE_MAX_WAIT_MS="20") as s:
        s.start_gateway()
        s.start_worker("w1@depth")
        s.wait_healthy()
        s.wait_ready()
        yield s


def client(stack: Stack) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{stack.http}/v1", api_key="none", max_retries=0, timeout=180)


def scores(engine, ids: list[int]) -> torch.Tensor:
    """The engine's own log-probabilities of every next token of `ids` (one pass, every position)."""
    seq = Sequence("score", ids, SamplingParams(), seed=0)
    seq.kv = SequenceKV(engine.kv_shape, len(ids))
    return torch.log_softmax(engine.runner.forward([Chunk(seq, 0, len(ids))], every_position=True), dim=-1)


def test_chat_logprobs_are_the_engines_own_scores_of_its_tokens(stack, invariant_engine):
    response = client(stack).chat.completions.create(
        model=MODEL, messages=QUESTION, max_tokens=10, temperature=0, logprobs=True, top_logprobs=3,
        extra_body={"cache": "off"})
    prompt = invariant_engine.encode(EngineRequest("p", messages=QUESTION))
    answer = invariant_engine.generate([EngineRequest("a", SamplingParams(max_tokens=10), messages=QUESTION)])["a"]
    table = scores(invariant_engine, prompt + answer.token_ids)
    content = response.choices[0].logprobs.content
    assert response.choices[0].message.content == answer.text and len(content) == len(answer.token_ids) > 3
    for i, (entry, token) in enumerate(zip(content, answer.token_ids)):
        row = table[len(prompt) - 1 + i]
        assert entry.token == invariant_engine.tokenizer.decode([token])
        assert entry.logprob == pytest.approx(float(row[token]), abs=1e-4)
        assert [t.logprob for t in entry.top_logprobs] == pytest.approx(row.topk(3).values.tolist(), abs=1e-4)
        assert entry.top_logprobs[0].token == entry.token  # greedy: the best alternative is the token
        assert bytes(entry.bytes) == entry.token.encode()


def test_completions_echo_scores_every_prompt_token_as_evaluation_harnesses_read_them(stack, invariant_engine):
    prompt = "The capital of France is Paris"
    response = client(stack).completions.create(model=MODEL, prompt=prompt, max_tokens=1, temperature=0, echo=True,
                                                logprobs=1, extra_body={"cache": "off"})
    ids = invariant_engine.encode(EngineRequest("p", prompt=prompt))
    lp = response.choices[0].logprobs
    assert response.choices[0].text.startswith(prompt)
    assert len(lp.tokens) == len(ids) + 1 and lp.token_logprobs[0] is None and lp.top_logprobs[0] is None
    table = scores(invariant_engine, ids)
    for i in range(1, len(ids)):
        assert lp.token_logprobs[i] == pytest.approx(float(table[i - 1, ids[i]]), abs=1e-4), i
        assert lp.tokens[i] == invariant_engine.tokenizer.decode([ids[i]])
    assert "".join(lp.tokens) == response.choices[0].text and lp.text_offset[1] == len(lp.tokens[0])


def test_a_token_id_prompt_scores_a_continuation_as_lm_evaluation_harness_reads_it(stack, invariant_engine):
    """lm-evaluation-harness's `local-completions` loglikelihood: ids from the server's /tokenize,
    `prompt: [[ids]]`, echo, logprobs 1, max_tokens 1; it sums token_logprobs[ctxlen:-1]."""
    c = client(stack)
    tokenize = lambda text: httpx.post(f"{stack.http}/tokenize", json={"prompt": text}).json()["tokens"]  # noqa: E731
    context, whole = tokenize("The capital of France is"), tokenize("The capital of France is Paris")
    assert whole[:len(context)] == context and len(whole) > len(context)
    response = c.completions.create(model=MODEL, prompt=[whole], echo=True, logprobs=1, max_tokens=1, temperature=0,
                                    seed=1234)
    lp = response.choices[0].logprobs
    assert len(lp.token_logprobs) == len(whole) + 1
    table = scores(invariant_engine, whole)
    expected = sum(float(table[i - 1, whole[i]]) for i in range(len(context), len(whole)))
    assert sum(lp.token_logprobs[len(context):-1]) == pytest.approx(expected, abs=1e-3)
    greedy = all(t == max(top.values()) for t, top in zip(lp.token_logprobs[len(context):-1],
                                                           lp.top_logprobs[len(context):-1]))
    assert greedy == all(int(table[i - 1].argmax()) == whole[i] for i in range(len(context), len(whole)))
    assert response.choices[0].text.startswith("The capital of France is Paris")


def _prefilled(stack: Stack) -> int:
    """Prompt positions the worker's engine has computed, from a heartbeat sent after this call."""
    since = time.time()
    statuses: list[dict] = []

    def fresh() -> bool:
        statuses[:] = worker_statuses(stack.redis.client)
        return bool(statuses) and all(s["updated_at"] > since for s in statuses)

    wait_until(fresh, 15, what="a heartbeat after now")
    return sum(s["prefill_tokens"] for s in statuses)


def test_n3_is_one_prefill_three_answers_and_streams_as_it_answers(stack):
    c = client(stack)
    # A prompt no earlier request had: no prefix-cache hit shortens its prefill.
    fresh = [{"role": "system", "content": "You answer in one short sentence."}, *QUESTION]
    before = _prefilled(stack)
    whole = c.chat.completions.create(model=MODEL, messages=fresh, max_tokens=12, temperature=1.0, seed=7, n=3,
                                      logprobs=True, extra_body={"cache": "off"})
    assert _prefilled(stack) - before == whole.usage.prompt_tokens  # the prompt computed once, not three times
    texts = [ch.message.content for ch in whole.choices]
    assert [ch.index for ch in whole.choices] == [0, 1, 2] and len(set(texts)) > 1  # sampled: they differ
    assert whole.usage.completion_tokens == sum(len(ch.logprobs.content) for ch in whole.choices)
    streamed = ["", "", ""]
    scored: list[list[float]] = [[], [], []]
    for chunk in c.chat.completions.create(model=MODEL, messages=fresh, max_tokens=12, temperature=1.0, seed=7,
                                           n=3, logprobs=True, stream=True, extra_body={"cache": "off"}):
        for ch in chunk.choices:
            streamed[ch.index] += ch.delta.content or ""
            scored[ch.index] += [e.logprob for e in (ch.logprobs.content if ch.logprobs else None) or []]
    assert streamed == texts  # seeded: the stream is the same three answers
    assert scored == [[e.logprob for e in ch.logprobs.content] for ch in whole.choices]


def test_ignore_eos_gives_exactly_max_tokens_and_the_sampling_extras_act(stack):
    c = client(stack)
    short = c.completions.create(model=MODEL, prompt="Say hi.", max_tokens=64, temperature=0,
                                 extra_body={"cache": "off"})
    assert short.usage.completion_tokens < 64  # the model stops by itself...
    longer = c.completions.create(model=MODEL, prompt="Say hi.", max_tokens=64, temperature=0,
                                  extra_body={"cache": "off", "ignore_eos": True})
    assert longer.usage.completion_tokens == 64 and longer.choices[0].finish_reason == "length"  # ...not here
    paris = c.chat.completions.create(model=MODEL, messages=QUESTION, max_tokens=20, temperature=0,
                                      extra_body={"cache": "off", "stop": ["Paris"], "include_stop_str_in_output": True})
    assert paris.choices[0].message.content.endswith("Paris")
    forced = c.chat.completions.create(model=MODEL, messages=QUESTION, max_tokens=5, temperature=0, logprobs=True,
                                       logit_bias={"28": 100}, extra_body={"cache": "off"})  # 28 is ","
    assert [e.token for e in forced.choices[0].logprobs.content] == [","] * 5
    # A stop token masked until min_tokens, then forced: exactly min_tokens + 1 tokens, ended by "stop".
    ended = c.chat.completions.create(model=MODEL, messages=QUESTION, max_tokens=30, temperature=0,
                                      logit_bias={"28": 100},
                                      extra_body={"cache": "off", "stop_token_ids": [28], "min_tokens": 3})
    assert ended.choices[0].finish_reason == "stop" and ended.usage.completion_tokens == 4


def test_vllms_truncate_prompt_tokens_and_continuous_usage_stats_act_end_to_end(stack, invariant_engine):
    c = client(stack)
    prompt = "The printing press spread across Europe in the fifteenth century. What colour is the sky?"
    ids = invariant_engine.encode(EngineRequest("t", prompt=prompt))
    cut = c.completions.create(model=MODEL, prompt=prompt, max_tokens=8, temperature=0,
                               extra_body={"cache": "off", "truncate_prompt_tokens": 10})
    assert cut.usage.prompt_tokens == 10 < len(ids)
    # The worker read the prompt's last 10 tokens: the same answer as those tokens sent as the prompt.
    last = c.completions.create(model=MODEL, prompt=ids[-10:], max_tokens=8, temperature=0, extra_body={"cache": "off"})
    assert cut.choices[0].text == last.choices[0].text
    usage = {"include_usage": True, "continuous_usage_stats": True}
    chunks = list(c.chat.completions.create(model=MODEL, messages=QUESTION, max_tokens=8, temperature=0, stream=True,
                                            stream_options=usage, extra_body={"cache": "off", "ignore_eos": True}))
    final = chunks[-1]
    assert final.choices == [] and final.usage.completion_tokens == 8
    assert all(ch.usage is not None and ch.usage.prompt_tokens == final.usage.prompt_tokens for ch in chunks)
    counts = [ch.usage.completion_tokens for ch in chunks]
    assert counts == sorted(counts) and len(set(counts)) >= 5 and counts[-2] == 8  # the usage so far, each chunk
    plain = list(c.chat.completions.create(model=MODEL, messages=QUESTION, max_tokens=8, temperature=0, stream=True,
                                           stream_options={"include_usage": True}, extra_body={"cache": "off"}))
    assert all(ch.usage is None for ch in plain[:-1]) and plain[-1].usage is not None


def test_a_json_schema_holds_for_every_answer_at_temperature_one(stack):
    response = client(stack).chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Describe a person as JSON."}], max_tokens=80,
        temperature=1.0, n=8, seed=3,
        response_format={"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON, "strict": True}},
        extra_body={"cache": "off"})
    for choice in response.choices:
        assert choice.finish_reason == "stop", choice.message.content
        jsonschema.validate(json.loads(choice.message.content), PERSON)
    assert len({ch.message.content for ch in response.choices}) > 1
    choice = client(stack).chat.completions.create(
        model=MODEL, messages=QUESTION, max_tokens=10, temperature=1.0, extra_body={"guided_choice": ["Paris", "Rome"]})
    assert choice.choices[0].message.content in ("Paris", "Rome")


def test_an_invalid_schema_is_a_400_with_the_reason(stack):
    with pytest.raises(openai.BadRequestError) as err:
        client(stack).chat.completions.create(model=MODEL, messages=QUESTION, response_format={
            "type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "object", "required": 3}}})
    assert err.value.body["code"] == "invalid_field" and err.value.body["param"] == "response_format"
    assert "cannot be used" in err.value.body["message"]


def test_langchain_calls_a_tool_and_fills_a_structured_answer(stack):
    from langchain_openai import ChatOpenAI
    from pydantic import BaseModel, Field

    llm = ChatOpenAI(model=MODEL, base_url=f"{stack.http}/v1", api_key="none", temperature=0, max_tokens=60,
                     max_retries=0)
    message = llm.bind_tools([WEATHER], tool_choice="get_weather").invoke("What is the weather in Paris?")
    assert [call["name"] for call in message.tool_calls] == ["get_weather"]
    assert isinstance(message.tool_calls[0]["args"]["city"], str)
    required = llm.bind_tools([WEATHER], tool_choice="required").invoke("Weather in Rome?")
    assert required.tool_calls and required.tool_calls[0]["name"] == "get_weather"
    # The call goes back with its result, as an agent would send it.
    follow = llm.bind_tools([WEATHER]).invoke(["What is the weather in Paris?", message,
                                                {"role": "tool", "tool_call_id": message.tool_calls[0]["id"],
                                                 "content": "18 C and sunny"}])
    # The earlier turn, the call and its result reached the prompt (more input tokens than the
    # question alone), and the answer is text.
    assert follow.usage_metadata["input_tokens"] > message.usage_metadata["input_tokens"]
    assert follow.content.strip()

    class City(BaseModel):
        name: str = Field(min_length=1, max_length=30)
        country: str = Field(min_length=1, max_length=30)

    out = llm.with_structured_output(City, method="json_schema", strict=True, include_raw=True).invoke(
        "Name a city in Italy.")
    # The server's own text is the schema's object, no key more (pydantic alone would drop extras).
    assert out["parsing_error"] is None and isinstance(out["parsed"], City)
    assert set(json.loads(out["raw"].content)) == {"name", "country"}


def test_a_stored_answer_serves_only_requests_it_satisfies(stack):
    c = client(stack)
    stored = lambda: stack.redis.client.zcard(redis_keys.CACHE_LRU)  # noqa: E731 (entries stored so far)
    entries = stored()
    plain = c.chat.completions.create(model=MODEL, messages=QUESTION, max_tokens=8, temperature=0)
    wait_until(lambda: stored() > entries, 15, what="the answer stored")  # stored after its `done`
    again = c.chat.completions.create(model=MODEL, messages=QUESTION, max_tokens=8, temperature=0)
    assert again.model_extra["brigade"]["cached"] == "exact" and again.choices[0].message.content == \
        plain.choices[0].message.content
    scored = c.chat.completions.create(model=MODEL, messages=QUESTION, max_tokens=8, temperature=0, logprobs=True)
    assert scored.model_extra["brigade"]["cached"] is None and len(scored.choices[0].logprobs.content) == 8
    shaped = c.chat.completions.create(model=MODEL, messages=QUESTION, max_tokens=8, temperature=0,
                                       extra_body={"guided_choice": ["Rome", "Oslo"]})
    assert shaped.model_extra["brigade"]["cached"] is None and shaped.choices[0].message.content in ("Rome", "Oslo")
    wait_until(lambda: stored() > entries + 1, 15, what="the guided answer stored")
    shaped_again = c.chat.completions.create(model=MODEL, messages=QUESTION, max_tokens=8, temperature=0,
                                             extra_body={"guided_choice": ["Rome", "Oslo"]})
    assert shaped_again.model_extra["brigade"]["cached"] == "exact"  # keyed by its grammar: its own entry


# ---- the same fields over the WebSocket protocol ------------------------------------------------

async def ws_events(url: str, frame: dict) -> tuple[str | None, list[dict]]:
    """One request's server id (from its `queued`) and its further events, up to its done or error,
    on a WebSocket of its own."""
    rid, events = None, []
    async with connect(url, max_size=None) as ws:
        await ws.send(json.dumps(frame))
        while not events or events[-1]["type"] not in ("done", "error"):
            event = json.loads(await asyncio.wait_for(ws.recv(), 120))
            if event["type"] == "queued":
                rid = event["request_id"]
            else:
                events.append(event)
    return rid, events


def test_websocket_n2_streams_each_choice_with_logprobs_and_a_resume_replays_them_alike(stack):
    frame = {"type": "generate", "id": "two", "messages": QUESTION, "n": 2, "logprobs": 1, "temperature": 1.0,
             "seed": 5, "max_tokens": 8, "cache": "off"}
    rid, events = asyncio.run(ws_events(stack.url, frame))
    done, tokens = events[-1], events[:-1]
    assert done["type"] == "done" and all(e["type"] == "token" for e in tokens), events
    assert [e["index"] for e in tokens] == list(range(len(tokens)))
    assert {e["choice"] for e in tokens} == {0, 1}
    for e in tokens:
        assert isinstance(e["logprobs"]["logprob"], float) and len(e["logprobs"]["top"]) == 1, e
    for choice in (0, 1):
        mine = [e for e in tokens if e["choice"] == choice]
        assert [e.get("finish_reason") for e in mine] == [None] * (len(mine) - 1) + [done["finish_reasons"][choice]]
    assert len(done["finish_reasons"]) == 2 and set(done["finish_reasons"]) <= {"stop", "length"}
    assert done["usage"]["completion_tokens"] == len(tokens)
    # A `resume` after index 2 replays the rest from the request's log, in the live events' shapes.
    _, replayed = asyncio.run(ws_events(stack.url, {"type": "resume", "id": rid, "after_index": 2}))
    assert [{**e, "id": "two"} for e in replayed[:-1]] == tokens[3:]
    assert replayed[-1]["type"] == "done" and replayed[-1]["finish_reasons"] == done["finish_reasons"]


def test_websocket_guide_choice_answers_exactly_one_of_the_choices(stack):
    for seed in (1, 2, 3):
        _, events = asyncio.run(ws_events(stack.url, {
            "type": "generate", "id": f"yn{seed}", "prompt": "Is the sky blue? Answer:", "temperature": 1.0,
            "seed": seed, "max_tokens": 10, "cache": "off", "guide": {"kind": "choice", "value": '["yes", "no"]'}}))
        assert events[-1]["type"] == "done" and events[-1]["finish_reason"] == "stop", events
        assert "".join(e["text"] for e in events[:-1]) in ("yes", "no")


def test_a_handed_over_n2_request_whose_every_choice_had_ended_gets_its_done_from_the_log(stack, invariant_engine):
    """A worker died after the last token of every choice was logged, before the `done` (a failover
    can lose that tail): the next worker runs nothing and publishes the done from the log (its
    usage with the prompt's tokens, each choice's end, the request's end as its last choice's)."""
    from ops.core.messages import QueuedRequest
    from ops.core.queue import QueueSender
    from ops.core.settings import Settings

    rid = f"ended-{time.monotonic_ns()}"
    queued = QueuedRequest(request_id=rid, client_id="c", reply_channel=redis_keys.reply_channel("gone"),
                           enqueued_at=time.time(), model=MODEL, messages=QUESTION,
                           params=queued_params(max_tokens=3, n=2, temperature=1.0, seed=1))
    r = stack.redis.client
    r.set(redis_keys.request(rid), queued.model_dump_json(), ex=300)
    logged = [(0, 504, None), (1, 504, None), (0, 2, "stop"), (1, 28, None), (1, 30, "length")]
    for index, (choice, token, end) in enumerate(logged):
        event = {"type": "token", "request_id": rid, "epoch": 1, "index": index, "choice": choice,
                 "token_id": token, "text": "x", **({"finish_reason": end} if end else {})}
        r.xadd(redis_keys.stream(rid), {"event": json.dumps(event)})
    QueueSender(Settings(redis_url=stack.redis.url)).send(queued)
    ends = wait_until(lambda: [json.loads(f["event"]) for _, f in r.xrange(redis_keys.stream(rid))
                               if json.loads(f["event"])["type"] != "token"], 60, what="the request's end")
    assert len(ends) == 1 and ends[0]["type"] == "done", ends
    assert ends[0]["finish_reasons"] == ["stop", "length"] and ends[0]["finish_reason"] == "length"
    prompt = len(invariant_engine.encode(EngineRequest("p", messages=QUESTION)))
    assert ends[0]["usage"] == {"prompt_tokens": prompt, "completion_tokens": 5}
