"""The Responses API (`/v1/responses`), driven by the official `openai` package's `client.responses`
against real processes: the stack of tests/test_openai_depth.py (one real worker with the default
model, one real gateway), whose module imports these tests. Each answer is held against the chat
door's answer to the same conversation, which the exact default makes token for token the same."""
from __future__ import annotations

import json

import httpx
import jsonschema
import openai
import pytest

from ops.core import redis_keys
from tests.services import Stack, wait_until

MODEL = "smollm2-135m-instruct"
FLAT_WEATHER = {"type": "function", "name": "get_weather", "description": "The weather in a city",
                "parameters": {"type": "object", "additionalProperties": False,
                               "properties": {"city": {"type": "string", "maxLength": 30}}, "required": ["city"]}}
GREEDY = {"temperature": 0, "extra_body": {"cache": "off"}}


def _client(stack: Stack) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{stack.http}/v1", api_key="none", max_retries=0, timeout=180)


def _chat_text(stack: Stack, messages: list[dict], max_tokens: int, **kw) -> str:
    answer = _client(stack).chat.completions.create(model=MODEL, messages=messages, max_tokens=max_tokens,
                                                    temperature=0, extra_body={"cache": "off"}, **kw)
    return answer.choices[0].message.content


def test_a_response_is_the_chat_answer_to_the_same_turn_streamed_or_not(stack):
    client = _client(stack)
    whole = client.responses.create(model=MODEL, input="What is the capital of France?", max_output_tokens=24,
                                    **GREEDY)
    chat = _chat_text(stack, [{"role": "user", "content": "What is the capital of France?"}], 24)
    assert whole.id.startswith("resp_") and whole.object == "response" and whole.model == MODEL
    assert whole.output_text == chat and whole.output[0].type == "message" and whole.output[0].role == "assistant"
    assert whole.status in ("completed", "incomplete") and whole.usage.output_tokens > 3
    assert whole.usage.total_tokens == whole.usage.input_tokens + whole.usage.output_tokens
    events = list(client.responses.create(model=MODEL, input="What is the capital of France?", max_output_tokens=24,
                                          stream=True, **GREEDY))
    kinds = [e.type for e in events]
    assert kinds[:4] == ["response.created", "response.in_progress", "response.output_item.added",
                         "response.content_part.added"]
    assert kinds[-4:] == ["response.output_text.done", "response.content_part.done", "response.output_item.done",
                          "response.completed" if whole.status == "completed" else "response.incomplete"]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert deltas == chat and events[-1].response.output_text == chat and kinds.count("response.output_text.delta") > 3
    assert events[-1].response.output[0].id == events[2].item.id  # the streamed item is the stored one
    # The package's own stream helper rebuilds the response from the events, item by item.
    with client.responses.stream(model=MODEL, input="What is the capital of France?", max_output_tokens=24,
                                 **GREEDY) as helper:
        assert helper.get_final_response().output_text == chat


def test_instructions_and_a_previous_response_continue_the_conversation_as_a_chat_would(stack):
    client = _client(stack)
    first = client.responses.create(model=MODEL, input="What is the capital of France?", max_output_tokens=16,
                                    instructions="Answer in one short sentence.", **GREEDY)
    second = client.responses.create(model=MODEL, input="And of Italy?", previous_response_id=first.id,
                                     max_output_tokens=16, **GREEDY)
    # Instructions belong to their request only (OpenAI's rule): the second turn runs without them.
    assert first.output_text == _chat_text(stack, [{"role": "system", "content": "Answer in one short sentence."},
                                                   {"role": "user", "content": "What is the capital of France?"}], 16)
    assert second.output_text == _chat_text(stack, [{"role": "user", "content": "What is the capital of France?"},
                                                    {"role": "assistant", "content": first.output_text},
                                                    {"role": "user", "content": "And of Italy?"}], 16)
    assert second.previous_response_id == first.id
    assert client.responses.retrieve(first.id).output_text == first.output_text  # stored, read back by id
    client.responses.delete(first.id)
    with pytest.raises(openai.NotFoundError) as gone:
        client.responses.create(model=MODEL, input="And of Spain?", previous_response_id=first.id, **GREEDY)
    assert gone.value.body["code"] == "not_found" and gone.value.body["param"] == "previous_response_id"
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(first.id)


def test_a_function_call_is_an_output_item_and_its_output_sent_back_gets_the_answer(stack):
    client = _client(stack)
    asked = "What is the weather in Paris?"
    called = client.responses.create(model=MODEL, input=asked, tools=[FLAT_WEATHER],
                                     tool_choice={"type": "function", "name": "get_weather"}, **GREEDY)
    call = called.output[0]
    assert [item.type for item in called.output] == ["function_call"] and call.name == "get_weather"
    assert isinstance(json.loads(call.arguments)["city"], str) and call.call_id.startswith("call_")
    streamed = list(client.responses.create(model=MODEL, input=asked, tools=[FLAT_WEATHER], stream=True,
                                            tool_choice={"type": "function", "name": "get_weather"}, **GREEDY))
    done = [e for e in streamed if e.type == "response.function_call_arguments.done"]
    assert len(done) == 1 and done[0].arguments == call.arguments and streamed[-1].type == "response.completed"
    answered = client.responses.create(
        model=MODEL, previous_response_id=called.id, tools=[FLAT_WEATHER], max_output_tokens=24,
        input=[{"type": "function_call_output", "call_id": call.call_id, "output": "Sunny, 21 degrees"}], **GREEDY)
    # The same conversation as a chat: the call as the assistant's turn, its output as the tool's.
    chat = _chat_text(stack, [{"role": "user", "content": asked},
                              {"role": "assistant", "content": None, "tool_calls": [
                                  {"id": call.call_id, "type": "function",
                                   "function": {"name": "get_weather", "arguments": call.arguments}}]},
                              {"role": "tool", "tool_call_id": call.call_id, "content": "Sunny, 21 degrees"}], 24,
                      tools=[{"type": "function", "function": {k: v for k, v in FLAT_WEATHER.items() if k != "type"}}])
    assert answered.output[0].type == "message" and answered.output_text == chat and chat


def test_a_json_schema_text_format_holds_for_the_answer(stack):
    schema = {"type": "object", "additionalProperties": False, "required": ["city"],
              "properties": {"city": {"type": "string", "maxLength": 20}}}
    answer = _client(stack).responses.create(
        model=MODEL, input="Name a city in Japan as JSON.", max_output_tokens=40,
        text={"format": {"type": "json_schema", "name": "city", "schema": schema}}, **GREEDY)
    jsonschema.validate(json.loads(answer.output_text), schema)


def test_a_background_response_is_polled_to_its_end_or_cancelled_from_another_gateway(stack):
    client = _client(stack)
    begun = client.responses.create(model=MODEL, input="Name a fruit.", max_output_tokens=12, background=True,
                                    **GREEDY)
    assert begun.status == "in_progress" and begun.background
    ended = wait_until(lambda: (r := client.responses.retrieve(begun.id)).status not in ("queued", "in_progress")
                       and r, timeout=120, what="the background response to end")
    assert ended.output_text == _chat_text(stack, [{"role": "user", "content": "Name a fruit."}], 12)
    raw = client.responses.with_raw_response.create(
        model=MODEL, input="Write a very long essay about the sea.", background=True, max_output_tokens=1500,
        temperature=0, extra_body={"cache": "off", "ignore_eos": True})
    long, rid = raw.parse(), raw.headers["x-request-id"]
    wait_until(lambda: stack.redis.client.xlen(redis_keys.stream(rid)) > 2, timeout=60, what="its first tokens")
    other = stack.gateways.get("responses-other") or stack.start_gateway("responses-other", BRIGADE_CACHE_ENABLED="0")
    stack.wait_healthy(gateways=["responses-other"])
    elsewhere = openai.OpenAI(base_url=f"http://127.0.0.1:{other.port}/v1", api_key="none", max_retries=0, timeout=60)
    assert elsewhere.responses.cancel(long.id).status == "cancelled"
    # The gateway that gathers it hears the worker stop, and stores what was made by then.
    stopped = wait_until(lambda: (r := client.responses.retrieve(long.id)).usage is not None and r, timeout=60,
                         what="the gathering gateway to store the cancelled response")
    assert stopped.status == "cancelled" and 2 < stopped.usage.output_tokens < 1500
    assert elsewhere.responses.cancel(long.id).status == "cancelled"  # again: answered as it is
    # Deleted while it runs: it stops, and its gateway does not store it again at its end.
    raw = client.responses.with_raw_response.create(
        model=MODEL, input="Write a very long story about a lighthouse.", background=True, max_output_tokens=1500,
        temperature=0, extra_body={"cache": "off", "ignore_eos": True})
    doomed, rid = raw.parse(), raw.headers["x-request-id"]
    wait_until(lambda: stack.redis.client.xlen(redis_keys.stream(rid)) > 2, timeout=60, what="its first tokens")
    gone = client.responses.with_raw_response.delete(doomed.id)
    assert gone.status_code == 200 and gone.http_response.json()["deleted"] is True

    def ended() -> bool:
        last = stack.redis.client.xrevrange(redis_keys.stream(rid), count=1)
        return bool(last) and '"done"' in next(iter(last[0][1].values()))
    wait_until(ended, timeout=60, what="the deleted response's request to stop")
    assert stack.redis.client.xlen(redis_keys.stream(rid)) < 1500
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(doomed.id)


def test_bad_bodies_and_impossible_cancels_get_named_errors(stack):
    for body, status, code, param in [
        ({"model": MODEL, "input": "Hi", "temperature": 0, "colour": "red"}, 400, "unknown_field", "colour"),
        ({"model": MODEL, "input": []}, 400, "invalid_field", "input"),
        ({"model": MODEL, "input": [{"type": "input_image", "image_url": "x"}]}, 400, "unsupported_field", "input"),
        ({"model": MODEL, "input": "Hi", "max_output_tokens": 0}, 400, "invalid_field", "max_output_tokens"),
        ({"model": MODEL, "input": "Hi", "tools": [{"type": "web_search"}]}, 400, "unsupported_field", "tools"),
        ({"model": MODEL, "input": "Hi", "previous_response_id": "resp_nope"}, 404, "not_found",
         "previous_response_id"),
    ]:
        r = httpx.post(f"{stack.http}/v1/responses", json=body, timeout=60)
        assert (r.status_code, r.json()["error"]["code"], r.json()["error"]["param"]) == (status, code, param), body
    done = _client(stack).responses.create(model=MODEL, input="Hi", max_output_tokens=2, **GREEDY)
    with pytest.raises(openai.BadRequestError) as refused:
        _client(stack).responses.cancel(done.id)
    assert refused.value.body["code"] == "not_cancellable"
    assert httpx.get(f"{stack.http}/v1/responses/resp_nope", timeout=30).status_code == 404
