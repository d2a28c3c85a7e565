# Over 400 lines: every field of the OpenAI bodies, each read into a request apart from any socket.
"""The OpenAI door's further fields, apart from any socket: bodies into `Generate`s
(gateway/doors/openai_schema.py), events into bodies and stream chunks (gateway/doors/openai_render.py,
its `ChunkStream`), tools into prompts and back (engine/chat_prompt.py,
gateway/tool_calls.py). The same fields against real processes: tests/test_openai_depth.py."""
from __future__ import annotations

import json

import pytest

from engine import chat_prompt
from gateway import tool_calls
from gateway.delivery.events import Done, Token
from gateway.doors import openai_render as render
from gateway.doors import openai_schema as oa
from gateway.doors.openai_render import ChunkStream
from gateway.doors.ws_protocol import ClientProtocol
from gateway.request import ProtocolError, RequestRules
from ops.core.settings import Settings

RULES = RequestRules(Settings())
FRAMES = ClientProtocol(Settings(), RULES)
USER = [{"role": "user", "content": "What is the weather in Paris?"}]
WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
CLOCK = {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object", "properties": {}}}}


def parse(body, chat=True):
    return oa.parse(body, chat, RULES, "x")


def test_every_sampling_field_reaches_the_generate_as_the_websocket_names_it():
    cmd, opts = parse({"messages": USER, "n": 3, "logprobs": True, "top_logprobs": 4, "presence_penalty": 0.5,
                       "frequency_penalty": -0.25, "logit_bias": {"42": -100, "7": 3}, "ignore_eos": True,
                       "min_tokens": 2, "min_p": 0.1, "stop_token_ids": [2], "skip_special_tokens": False,
                       "include_stop_str_in_output": True, "prompt_logprobs": 1, "max_tokens": 9})
    p = cmd.params
    assert (p.n, p.logprobs, p.presence_penalty, p.frequency_penalty) == (3, 4, 0.5, -0.25)
    assert p.logit_bias == {"42": -100.0, "7": 3.0} and p.ignore_eos and p.min_tokens == 2 and p.min_p == 0.1
    assert p.stop_token_ids == [2] and not p.skip_special_tokens and p.include_stop_str_in_output
    assert p.prompt_logprobs == 1
    assert opts.n == 3 and opts.logprobs and opts.prompt_logprobs and opts.echo is None


def test_completions_echo_with_logprobs_asks_for_the_prompts_scores():
    cmd, opts = parse({"prompt": "The capital of France is", "echo": True, "logprobs": 2, "max_tokens": 1}, chat=False)
    assert cmd.params.logprobs == 2 and cmd.params.prompt_logprobs == 2
    assert opts.echo == "The capital of France is" and opts.logprobs
    cmd, opts = parse({"prompt": "Hi", "echo": True, "max_tokens": 1}, chat=False)
    assert cmd.params.prompt_logprobs is None and opts.echo == "Hi" and not opts.logprobs


@pytest.mark.parametrize("prompt", [[5, 6, 7], [[5, 6, 7]]])
def test_a_prompt_of_token_ids_as_harnesses_send_it_is_taken_and_echoed_from_its_tokens(prompt):
    cmd, opts = parse({"prompt": prompt, "echo": True, "max_tokens": 1}, chat=False)
    assert cmd.prompt_ids == [5, 6, 7] and cmd.prompt is None and opts.echo == oa.ECHO_TOKENS
    assert cmd.params.prompt_logprobs == 0  # the echoed text comes from the prompt tokens' entries
    answer = render.Answer()
    answer.add(Token("r", 0, "!", prompt_logprobs=[
        {"token": "A", "id": 5, "logprob": None, "top": []}, {"token": " b", "id": 6, "logprob": -1.0, "top": []},
        {"token": "c", "id": 7, "logprob": -2.0, "top": []}]))
    body = render.completion_body(opts, "r", answer, Done("r", "length", {}, {}), 0, "r")
    assert body["choices"][0]["text"] == "A bc!" and body["choices"][0]["logprobs"] is None


@pytest.mark.parametrize("prompt", [["a", "b"], [[1, 2], [3]], [1, "a"], [], [[]], [True, 1], ["a", [1]]])
def test_several_prompts_in_one_batch_line_or_mixed_ones_are_refused(prompt):
    with pytest.raises(ProtocolError) as err:
        parse({"prompt": prompt}, chat=False)  # a batch line's body: one prompt
    assert err.value.field in ("prompt", "prompt_ids") and oa.status_of(err.value.code) == 400


def test_several_prompts_are_each_a_request_of_their_own_in_prompt_order():
    asks = oa.parse_prompts({"prompt": ["One", "Two", "Three"], "echo": True, "logprobs": 1, "max_tokens": 1}, False,
                            RULES, "x")
    assert [cmd.prompt for cmd, _ in asks] == ["One", "Two", "Three"]
    assert [opts.echo for _, opts in asks] == ["One", "Two", "Three"]
    assert len({cmd.id for cmd, _ in asks}) == 3 and all(cmd.params.prompt_logprobs == 1 for cmd, _ in asks)
    ids = oa.parse_prompts({"prompt": [[5, 6], [7, 8, 9]], "max_tokens": 1}, False, RULES, "x")
    assert [cmd.prompt_ids for cmd, _ in ids] == [[5, 6], [7, 8, 9]]
    for one in ({"prompt": [5, 6]}, {"prompt": [[5, 6]]}, {"prompt": ["One"]}, {"prompt": "One"}):
        assert len(oa.parse_prompts({**one, "max_tokens": 1}, False, RULES, "x")) == 1


@pytest.mark.parametrize("body, field", [
    ({"prompt": ["a", "b"], "stream": True}, "stream"),  # answered in one body, not streamed
    ({"prompt": ["a", "b", "c"]}, "prompt"),  # over BRIGADE_MAX_PROMPTS_PER_REQUEST (2 here)
    ({"prompt": ["a", ""]}, "prompt"),  # each prompt passes the rules
])
def test_several_prompts_refused_whole(body, field):
    with pytest.raises(ProtocolError) as err:
        oa.parse_prompts(body, False, RequestRules(Settings(max_prompts_per_request=2)), "x")
    assert err.value.field == field and oa.status_of(err.value.code) == 400


def test_max_tokens_0_with_echo_scores_the_prompt_and_is_refused_without_it():
    for body in ({"prompt": "Hi there", "echo": True, "max_tokens": 0},
                 {"prompt": [5, 6, 7], "echo": True, "logprobs": 1, "max_tokens": 0},
                 {"prompt": "Hi there", "prompt_logprobs": 0, "max_tokens": 0}):
        cmd, _ = parse(body, chat=False)
        assert cmd.params.max_tokens == 0 and cmd.params.prompt_logprobs is not None
    for body, field in (({"prompt": "Hi there", "max_tokens": 0}, "max_tokens"),
                        ({"prompt": "Hi there", "echo": True, "max_tokens": 0, "n": 2}, "max_tokens"),
                        ({"messages": USER, "max_completion_tokens": 0}, "max_completion_tokens")):
        with pytest.raises(ProtocolError) as err:
            parse(body, chat="messages" in body)
        assert (err.value.code, err.value.field) == ("invalid_field", field)


def test_a_prompt_only_scored_is_echoed_with_its_scores_from_its_done_event():
    entries = [{"token": "Hi", "id": 5, "logprob": None, "top": []},
               {"token": " there", "id": 6, "logprob": -1.5, "top": [[" you", -0.5, 9]]}]
    _, opts = parse({"prompt": "Hi there", "echo": True, "logprobs": 1, "max_tokens": 0}, chat=False)
    done = Done("r", "length", {"prompt_tokens": 2, "completion_tokens": 0}, {}, prompt_logprobs=entries)
    body = render.completion_body(opts, "r", render.Answer(), done, 0, "r")
    choice = body["choices"][0]
    assert choice["text"] == "Hi there" and choice["finish_reason"] == "length"
    assert choice["logprobs"]["token_logprobs"] == [None, -1.5] and choice["logprobs"]["tokens"] == ["Hi", " there"]
    assert choice["logprobs"]["top_logprobs"] == [None, {" you": -0.5}]
    assert body["usage"] == {"prompt_tokens": 2, "completion_tokens": 0, "total_tokens": 2}
    stream = ChunkStream(opts, "r")
    chunks = list(stream.done(done, "r"))
    assert chunks[0]["choices"][0]["text"] == "Hi there"
    assert chunks[0]["choices"][0]["logprobs"]["token_logprobs"] == [None, -1.5]


def test_several_prompts_answers_are_numbered_prompt_by_prompt_with_usage_summed():
    asks = oa.parse_prompts({"prompt": ["A", "B"], "n": 2, "max_tokens": 1, "temperature": 1.0}, False, RULES, "x")
    parts = []
    for p, (cmd, opts) in enumerate(asks):
        answer = render.Answer(2)
        for c in range(2):
            answer.add(Token(cmd.id, c, f"{'AB'[p]}{c}", choice=c, finish_reason="length"))
        done = Done(cmd.id, "length", {"prompt_tokens": 3 + p, "completion_tokens": 2}, {}, finish_reasons=["length"] * 2)
        parts.append((opts, answer, done, f"server-{p}"))
    body = render.prompts_body(parts, "x", 0)
    assert [(c["index"], c["text"]) for c in body["choices"]] == [(0, "A0"), (1, "A1"), (2, "B0"), (3, "B1")]
    assert body["usage"] == {"prompt_tokens": 7, "completion_tokens": 4, "total_tokens": 11}
    assert [b["request_id"] for b in body["brigade"]["prompts"]] == ["server-0", "server-1"]
    assert body["object"] == "text_completion" and body["id"] == "cmpl-x"


@pytest.mark.parametrize("body, kind, value", [
    ({"response_format": {"type": "json_object"}}, "json_object", ""),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "integer"}}}},
     "json_schema", '{"type": "integer"}'),
    ({"guided_json": {"type": "integer"}}, "json_schema", '{"type": "integer"}'),
    ({"guided_regex": "[ab]+"}, "regex", "[ab]+"),
    ({"guided_choice": ["yes", "no"]}, "choice", '["yes", "no"]'),
    ({"structured_outputs": {"choice": ["yes", "no"]}}, "choice", '["yes", "no"]'),
])
def test_structured_output_in_any_spelling_becomes_one_guide(body, kind, value):
    cmd, _ = parse({"messages": USER, **body})
    assert (cmd.params.guide.kind, cmd.params.guide.value) == (kind, value)


@pytest.mark.parametrize("body, field", [
    ({"guided_regex": "[a", "max_tokens": 5}, "guided_regex"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "nonsense"}}}},
     "response_format"),
    ({"guided_choice": []}, "guided_choice"),
    ({"guided_regex": "a", "guided_choice": ["a"]}, "guided_regex"),
    ({"min_tokens": 20, "max_tokens": 10}, "min_tokens"),
    ({"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice"),
    ({"tools": [WEATHER], "tool_choice": "required", "response_format": {"type": "json_object"}}, "tool_choice"),
    ({"reasoning_effort": "high"}, "reasoning_effort"),
    ({"top_logprobs": 21, "logprobs": True}, "top_logprobs"),
    ({"logprobs": 1}, "logprobs"),  # chat's logprobs is a boolean; 1 is not true
    ({"use_beam_search": 0}, "use_beam_search"),
    ({"add_special_tokens": True}, "add_special_tokens"),
    ({"tools": [WEATHER], "parallel_tool_calls": "no"}, "parallel_tool_calls"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object", "required": 3}}}],
      "tool_choice": "required"}, "tools"),
    ({"structured_outputs": {"structural_tag": "x"}}, "structured_outputs.structural_tag"),
    ({"guided_json": {"type": "integer"}, "structured_outputs": {"json": {"type": "string"}}},
     "structured_outputs.json"),
    ({"functions": [{"name": "f"}]}, "functions"),
])
def test_what_cannot_run_is_a_400_naming_the_field_and_why(body, field):
    with pytest.raises(ProtocolError) as err:
        parse({"messages": USER, **body})
    assert err.value.field == field and oa.status_of(err.value.code) == 400
    assert len(err.value.message) > 20  # says why, not just what


def test_vllms_spellings_of_the_defaults_are_taken():
    cmd, _ = parse({"messages": USER, "top_k": -1, "add_special_tokens": False,
                    "structured_outputs": {"json_object": False}})
    assert cmd.params.top_k == 0 and cmd.params.guide is None
    cmd, _ = parse({"prompt": "Hi", "add_special_tokens": True}, chat=False)
    with pytest.raises(ProtocolError) as err:
        parse({"prompt": "Hi", "add_special_tokens": False}, chat=False)
    assert err.value.field == "add_special_tokens"


def test_accepted_and_ignored_fields_change_nothing():
    plain, _ = parse({"messages": USER})
    ignored, _ = parse({"messages": USER, "metadata": {"a": "b"}, "store": False, "service_tier": "auto",
                        "guided_decoding_backend": "xgrammar", "priority": 3, "best_of": 1, "request_id": "r"})
    assert ignored.params == plain.params and ignored.messages == plain.messages


def test_tool_choice_required_and_named_are_decoded_under_a_schema():
    cmd, opts = parse({"messages": USER, "tools": [WEATHER, CLOCK], "tool_choice": "required"})
    schema = json.loads(cmd.params.guide.value)
    assert schema["type"] == "array" and schema["minItems"] == 1
    assert [c["properties"]["name"]["const"] for c in schema["items"]["anyOf"]] == ["get_weather", "get_time"]
    assert opts.tools == [WEATHER, CLOCK] and opts.tool_choice == "required"
    cmd, opts = parse({"messages": USER, "tools": [WEATHER], "parallel_tool_calls": False,
                       "tool_choice": {"type": "function", "function": {"name": "get_weather"}}})
    assert json.loads(cmd.params.guide.value) == WEATHER["function"]["parameters"]
    assert opts.tool_choice == "function:get_weather"
    cmd, opts = parse({"messages": USER, "tools": [WEATHER]})
    assert cmd.params.guide is None and opts.tool_choice == "auto"


def test_tool_turns_in_the_history_are_accepted_and_rendered_for_a_template_without_tools(renderer):
    history = USER + [
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "18 C and sunny"}]
    cmd, _ = parse({"messages": history, "tools": [WEATHER]})
    assert cmd.messages[1].tool_calls[0].name == "get_weather" and cmd.messages[2].tool_call_id == "call_1"
    text = chat_prompt.render(renderer.tokenizer, [m.model_dump(exclude_none=True) for m in cmd.messages], cmd.tools)
    assert not chat_prompt.knows_tools(renderer.tokenizer)  # SmolLM2's template: Brigade's Hermes form
    assert '<tools>\n{"type": "function", "function": {"name": "get_weather"' in text
    assert '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>' in text
    assert "<|im_start|>user\n<tool_response>\n18 C and sunny\n</tool_response><|im_end|>" in text
    plain = chat_prompt.render(renderer.tokenizer, USER)
    assert plain == renderer.tokenizer.apply_chat_template(USER, add_generation_prompt=True, tokenize=False)


def test_calls_are_read_back_as_each_tool_choice_asks():
    tools = [WEATHER, CLOCK]
    content, calls = tool_calls.parse('[{"name": "get_weather", "parameters": {"city": "Oslo"}}]', "required", tools)
    assert content is None and [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in calls] == [
        ("get_weather", {"city": "Oslo"})]
    content, calls = tool_calls.parse('{"city": "Rome"}', "function:get_weather", tools)
    assert calls[0]["function"]["name"] == "get_weather" and json.loads(calls[0]["function"]["arguments"]) == {
        "city": "Rome"}
    text = 'Let me check.\n<tool_call>\n{"name": "get_time", "arguments": {}}\n</tool_call>'
    content, calls = tool_calls.parse(text, "auto", tools)
    assert content == "Let me check." and calls[0]["function"]["name"] == "get_time"
    assert tool_calls.parse("It is sunny.", "auto", tools) == ("It is sunny.", [])
    assert tool_calls.parse('{"city": "Ro', "function:get_weather", tools) == ('{"city": "Ro', [])  # cut short


def _lp(token, logprob, *alternatives):
    return {"token": token, "logprob": logprob, "top": [list(a) for a in alternatives]}


EVENTS = [
    Token("r", 0, "Hi", choice=0, logprobs=_lp("Hi", -0.1, ("Hi", -0.1, 5))),
    Token("r", 1, "Yo", choice=1, logprobs=_lp("Yo", -2.0, ("Hi", -0.1, 5))),
    Token("r", 2, "!", choice=1, logprobs=_lp("!", -0.5, ("!", -0.5, 9)), finish_reason="stop"),
    Token("r", 3, " there", choice=0, logprobs=_lp(" there", -float("inf"))),
]
DONE = Done("r", "length", {"prompt_tokens": 4, "completion_tokens": 4}, {}, finish_reasons=["length", "stop"])


def _whole(opts):
    answer = render.Answer(opts.n)
    for e in EVENTS:
        answer.add(e)
    return render.completion_body(opts, "r", answer, DONE, 0, "r")


def test_n_choices_with_logprobs_render_whole_and_streamed_alike():
    opts = oa.Options(True, True, True, "m", "max_tokens", n=2, logprobs=True)
    whole = _whole(opts)
    assert [c["message"]["content"] for c in whole["choices"]] == ["Hi there", "Yo!"]
    assert [c["finish_reason"] for c in whole["choices"]] == ["length", "stop"]
    first = whole["choices"][0]["logprobs"]["content"]
    assert [e["token"] for e in first] == ["Hi", " there"] and first[1]["logprob"] == render.LOWEST_LOGPROB
    assert first[0]["top_logprobs"] == [{"token": "Hi", "logprob": -0.1, "bytes": [72, 105]}]
    stream = ChunkStream(opts, "r")
    chunks = [c for e in EVENTS for c in stream.token(e)] + list(stream.done(DONE, "r"))
    texts, scored, finishes = ["", ""], [[], []], {}
    for c in chunks:
        for ch in c["choices"]:
            texts[ch["index"]] += ch["delta"].get("content") or ""
            scored[ch["index"]] += (ch["logprobs"] or {}).get("content", [])
            if ch["finish_reason"]:
                finishes[ch["index"]] = ch["finish_reason"]
    assert texts == ["Hi there", "Yo!"] and finishes == {0: "length", 1: "stop"}
    assert scored[0] == first and scored[1] == whole["choices"][1]["logprobs"]["content"]
    assert chunks[-1]["usage"]["completion_tokens"] == 4


def test_vllms_prompt_logprobs_ride_in_the_first_chunk_and_the_whole_body():
    opts = oa.Options(False, True, False, "m", "max_tokens", prompt_logprobs=True)
    prompt = [{"token": "A", "id": 4, "logprob": None, "top": []},
              {"token": " B", "id": 9, "logprob": -3.0, "top": [[" X", -1.0, 8]]}]
    event = Token("r", 0, " C", prompt_logprobs=prompt)
    chunks = list(ChunkStream(opts, "r").token(event))
    expected = [None, {"8": {"logprob": -1.0, "rank": 1, "decoded_token": " X"},
                       "9": {"logprob": -3.0, "rank": None, "decoded_token": " B"}}]
    assert chunks[0]["prompt_logprobs"] == expected
    answer = render.Answer()
    answer.add(event)
    assert render.completion_body(opts, "r", answer, Done("r", "length", {}, {}), 0, "r")["prompt_logprobs"] == expected


def test_completions_echo_puts_the_prompt_and_its_scores_first():
    opts = oa.Options(False, False, False, "m", "max_tokens", logprobs=True, echo="A B")
    answer = render.Answer()
    answer.add(Token("r", 0, " C", logprobs=_lp(" C", -1.5, (" C", -1.5, 3)),
                     prompt_logprobs=[{"token": "A", "logprob": None, "top": []}, _lp(" B", -3.0, (" X", -1.0, 8))]))
    body = render.completion_body(opts, "r", answer, Done("r", "length", {}, {}), 0, "r")
    lp = body["choices"][0]["logprobs"]
    assert body["choices"][0]["text"] == "A B C"
    assert lp["tokens"] == ["A", " B", " C"] and lp["token_logprobs"] == [None, -3.0, -1.5]
    assert lp["top_logprobs"] == [None, {" X": -1.0}, {" C": -1.5}] and lp["text_offset"] == [0, 1, 3]


def test_a_streamed_tool_call_arrives_whole_in_one_delta():
    opts = oa.Options(True, True, False, "m", "max_tokens", tools=[WEATHER], tool_choice="required")
    stream = ChunkStream(opts, "r")
    pieces = ['[{"name": "get_weather", ', '"parameters": {"city": "Oslo"}}]']
    chunks = [c for i, p in enumerate(pieces) for c in stream.token(Token("r", i, p))]
    assert chunks == []  # held: calls are read from the whole text
    chunks = list(stream.done(Done("r", "stop", {}, {}), "r"))
    delta = chunks[0]["choices"][0]["delta"]
    assert delta["content"] is None and delta["tool_calls"][0]["function"]["name"] == "get_weather"
    assert delta["tool_calls"][0]["index"] == 0 and chunks[-1]["choices"][0]["finish_reason"] == "tool_calls"


@pytest.mark.parametrize("frame, code, field", [
    ({"prompt_ids": [1, -2]}, "invalid_field", "prompt_ids"),
    ({"prompt_ids": []}, "invalid_field", "prompt_ids"),
    ({"prompt_ids": [1, 2], "prompt": "x"}, "missing_field", "prompt"),
    ({"prompt_ids": [1], "tools": [WEATHER]}, "invalid_field", "tools"),
])
def test_the_websocket_takes_a_prompt_of_token_ids_checked_like_any_field(frame, code, field):
    ok = FRAMES.parse(json.dumps({"type": "generate", "id": "a", "prompt_ids": [3, 4]}))
    assert ok.prompt_ids == [3, 4] and ok.prompt is None and ok.messages is None
    with pytest.raises(ProtocolError) as err:
        FRAMES.parse(json.dumps({"type": "generate", "id": "a", **frame}))
    assert (err.value.code, err.value.field) == (code, field)


def test_each_field_is_declared_once_and_the_door_the_engine_and_the_cache_key_follow_it():
    import dataclasses

    from engine import SamplingParams
    from ops.core.messages import GenerateParams

    roles = GenerateParams.roles()
    assert set(roles) == set(GenerateParams.model_fields)  # every field says what it is to the others
    # The worker's mapping is the declaration's: every engine field is made from the request's field
    # of the same name (the guide's spec by the worker), and the engine has no field the request lacks.
    engine_made = {name for name, role in roles.items() if role.engine is not None}
    assert engine_made | {"guide"} == {f.name for f in dataclasses.fields(SamplingParams)}
    # The OpenAI door takes every field whose Role says "same" under its own name, on both routes.
    assert GenerateParams.door_fields() <= oa.CHAT_FIELDS & oa.COMPLETION_FIELDS
    assert "truncate_prompt_tokens" in GenerateParams.door_fields()
    assert "continuous_usage_stats" not in GenerateParams.door_fields()  # read from stream_options
    # The cache key: a field that changes the text is in it once it departs from its default;
    # one that changes only what is reported is never in it.
    base = GenerateParams(max_tokens=8, temperature=0.0, top_p=1.0, top_k=0, repetition_penalty=1.0)
    assert "truncate_prompt_tokens" not in base.key_fields()
    assert base.model_copy(update={"truncate_prompt_tokens": 5}).key_fields()["truncate_prompt_tokens"] == 5
    assert base.model_copy(update={"continuous_usage_stats": True}).key_fields() == base.key_fields()
    assert "truncate_prompt_tokens" in GenerateParams.number_fields()


def test_a_caller_that_changes_the_defaults_changes_no_later_request():
    """The defaults are read once per process and shared: the mapping is read-only, and a default
    list or dict handed out is the caller's own."""
    from ops.core.messages import GenerateParams

    defaults = GenerateParams.defaults()
    with pytest.raises(TypeError):
        defaults["n"] = 4
    defaults["stop_token_ids"].append(2)
    defaults["logit_bias"]["7"] = 5.0
    assert GenerateParams.defaults()["stop_token_ids"] == [] and GenerateParams.defaults()["logit_bias"] == {}
    base = GenerateParams(max_tokens=8, temperature=0.0, top_p=1.0, top_k=0, repetition_penalty=1.0)
    assert not {"stop_token_ids", "logit_bias"} & set(base.key_fields())  # still at their defaults


def test_truncate_prompt_tokens_and_continuous_usage_stats_reach_the_generate():
    cmd, _ = parse({"messages": USER, "truncate_prompt_tokens": 5, "stream": True,
                    "stream_options": {"include_usage": True, "continuous_usage_stats": True}})
    assert cmd.params.truncate_prompt_tokens == 5 and cmd.params.continuous_usage_stats
    unstreamed, _ = parse({"messages": USER, "stream_options": {"include_usage": True, "continuous_usage_stats": True}})
    assert not unstreamed.params.continuous_usage_stats  # chunks only: an answer in one body has one usage
    # vLLM's rule: usage on every chunk only when the final usage is asked too.
    cmd, opts = parse({"messages": USER, "stream": True, "stream_options": {"continuous_usage_stats": True}})
    assert not cmd.params.continuous_usage_stats and not opts.include_usage
    for body, field in (({"messages": USER, "truncate_prompt_tokens": 0}, "truncate_prompt_tokens"),
                        ({"messages": USER, "truncate_prompt_tokens": True}, "truncate_prompt_tokens"),
                        ({"messages": USER, "stream_options": {"continuous_usage_stats": "yes"}}, "stream_options")):
        with pytest.raises(ProtocolError) as err:
            parse(body)
        assert (err.value.code, err.value.field) == ("invalid_field", field)


def test_a_stream_with_continuous_usage_carries_the_usage_so_far_on_every_chunk():
    _, opts = parse({"messages": USER, "stream": True,
                     "stream_options": {"include_usage": True, "continuous_usage_stats": True}})
    stream = ChunkStream(opts, "r")
    chunks = [c for i in range(3) for c in stream.token(
        Token("r", i, "ab"[i % 2], usage={"prompt_tokens": 7, "completion_tokens": i + 1}))]
    chunks += list(stream.done(Done("r", "stop", {"prompt_tokens": 7, "completion_tokens": 3}, {}), "r"))
    assert [c["usage"]["completion_tokens"] for c in chunks[:3]] == [1, 2, 3]
    assert all(c["usage"]["prompt_tokens"] == 7 and c["usage"]["total_tokens"] == 7 + c["usage"]["completion_tokens"]
               for c in chunks)
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 3


def test_responses_input_items_become_the_chats_turns_calls_of_one_turn_together():
    from gateway.doors.responses_schema import input_messages

    turns = input_messages([
        {"role": "developer", "content": [{"type": "input_text", "text": "Be "},
                                          {"type": "input_text", "text": "brief."}]},
        {"type": "message", "role": "user", "content": "Weather in Paris and Rome?"},
        {"type": "function_call", "call_id": "c1", "name": "get_weather", "arguments": "{\"city\": \"Paris\"}"},
        {"type": "function_call", "call_id": "c2", "name": "get_weather", "arguments": "{\"city\": \"Rome\"}"},
        {"type": "function_call_output", "call_id": "c1", "output": "Sunny"},
        {"type": "function_call_output", "call_id": "c2", "output": "Rain"}])
    assert [t["role"] for t in turns] == ["system", "user", "assistant", "tool", "tool"]
    assert turns[0]["content"] == "Be brief." and [c["id"] for c in turns[2]["tool_calls"]] == ["c1", "c2"]
    assert (turns[3]["tool_call_id"], turns[4]["content"]) == ("c1", "Rain")
    assert input_messages("Hi") == [{"role": "user", "content": "Hi"}]
