"""The client protocol as a pure function: every bad frame gets a named error."""
from __future__ import annotations

import json

import pytest

from gateway.doors.ws_protocol import Cancel, ClientProtocol
from gateway.request import Generate, ProtocolError, runnable
from ops.core.sampling_defaults import load_sampling_defaults
from ops.core.settings import Settings


@pytest.fixture
def protocol() -> ClientProtocol:
    return ClientProtocol(Settings())


def good(**fields) -> str:
    return json.dumps({"type": "generate", "id": "r1", "prompt": "hi", **fields})


@pytest.mark.parametrize(
    "frame, code, field",
    [
        (b"\x00\x01", "binary_frame", None),
        ("not json", "invalid_json", None),
        ("[1, 2]", "invalid_message", None),
        (json.dumps({"id": "x"}), "missing_field", "type"),
        (json.dumps({"type": "dance", "id": "x"}), "unknown_type", "type"),
        (json.dumps({"type": "generate", "prompt": "hi"}), "missing_field", "id"),
        (json.dumps({"type": "generate", "id": 7, "prompt": "hi"}), "invalid_field", "id"),
        (json.dumps({"type": "generate", "id": "r1"}), "missing_field", "prompt"),
        (good(temperature=-1), "invalid_field", "temperature"),
        (good(temperature="0.5"), "invalid_field", "temperature"),
        (good(max_tokens=10**9), "invalid_field", "max_tokens"),
        (good(max_tokens=0), "invalid_field", "max_tokens"),
        (good(max_tokens=True), "invalid_field", "max_tokens"),
        (good(top_p=0), "invalid_field", "top_p"),
        (good(top_k=-3), "invalid_field", "top_k"),
        (good(seed=-1), "invalid_field", "seed"),
        (good(stop=["x"] * 50), "invalid_field", "stop"),
        (good(stop=[""]), "invalid_field", "stop"),
        (good(cache="sometimes"), "invalid_field", "cache"),
        (good(cache_threshold=1.5), "invalid_field", "cache_threshold"),
        (good(cache_threshold="high"), "invalid_field", "cache_threshold"),
        (good(model="gpt-9"), "model_not_found", "model"),
        (good(colour="blue"), "unknown_field", "colour"),
        (good(prompt="x" * 10_000_000), "prompt_too_long", "prompt"),
        (good(prompt="   "), "invalid_field", "prompt"),
        (json.dumps({"type": "generate", "id": "r1", "messages": []}), "invalid_field", "messages"),
        (json.dumps({"type": "generate", "id": "r1", "messages": [{"role": "robot", "content": "x"}]}),
         "invalid_field", "messages"),
        (json.dumps({"type": "generate", "id": "r1", "messages": [{"role": "user", "content": ""}]}),
         "invalid_field", "messages"),
        (json.dumps({"type": "generate", "id": "r1", "messages": [{"role": "user", "content": " \n\t"}]}),
         "invalid_field", "messages"),
        (json.dumps({"type": "generate", "id": "r1", "prompt": "a", "messages": [{"role": "user", "content": "x"}]}),
         "missing_field", "prompt"),
    ],
)
def test_bad_frame_gets_a_named_error(protocol, frame, code, field):
    with pytest.raises(ProtocolError) as err:
        protocol.parse(frame)
    assert err.value.code == code
    assert err.value.field == field
    event = err.value.event().wire()
    assert event["type"] == "error" and event["code"] == code and event["message"]


def test_error_names_the_request_when_its_id_is_known(protocol):
    with pytest.raises(ProtocolError) as err:
        protocol.parse(good(temperature=-1))
    assert err.value.event().wire()["id"] == "r1"


def test_good_generate_leaves_unset_what_it_leaves_out_and_runnable_fills_it_once(protocol):
    cmd = protocol.parse(good(max_tokens=12, stop=["\n"], seed=7))
    assert isinstance(cmd, Generate)
    assert cmd.id == "r1" and cmd.prompt == "hi" and cmd.cache == "auto"
    assert cmd.params.max_tokens == 12 and cmd.params.seed == 7
    assert cmd.params.unset == ("temperature", "top_p", "top_k", "repetition_penalty")
    # Admission fills the rest from the routed version's defaults; what the client gave is kept.
    defaults = load_sampling_defaults(Settings())
    ran = runnable(cmd, defaults, Settings())
    assert (ran.params.temperature, ran.params.top_p) == (defaults.temperature, defaults.top_p)
    assert ran.params.max_tokens == 12 and not ran.params.unset


def test_limits_hold_on_the_values_that_run_a_defaults_too(protocol):
    cmd = protocol.parse(good(min_tokens=20))  # no max_tokens: nothing to compare with yet
    with pytest.raises(ProtocolError) as err:
        runnable(cmd, load_sampling_defaults(Settings(default_max_tokens=10)), Settings())
    assert (err.value.code, err.value.field, err.value.request_id) == ("invalid_field", "min_tokens", "r1")
    with pytest.raises(ProtocolError) as err:
        protocol.parse(good(min_tokens=20, max_tokens=10))  # both given: refused at the door
    assert err.value.field == "min_tokens"


def test_chat_messages_are_accepted(protocol):
    cmd = protocol.parse(json.dumps({"type": "generate", "id": "m", "messages": [{"role": "user", "content": "hey"}]}))
    assert cmd.messages[0].role == "user" and cmd.prompt is None


def test_a_blank_message_is_refused_like_a_blank_prompt_naming_its_index(protocol):
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"},
                {"role": "assistant", "content": "Hello!"}, {"role": "user", "content": "   "}]
    with pytest.raises(ProtocolError) as err:
        protocol.parse(json.dumps({"type": "generate", "id": "m", "messages": messages}))
    assert (err.value.code, err.value.field, err.value.request_id) == ("invalid_field", "messages", "m")
    assert "messages[3]" in err.value.message
    messages[3]["content"] = "And you?"
    assert len(protocol.parse(json.dumps({"type": "generate", "id": "m", "messages": messages})).messages) == 4
    messages[2]["content"] = ""  # a blank assistant turn is no question: it passes, as OpenAI lets it
    assert protocol.parse(json.dumps({"type": "generate", "id": "m", "messages": messages})).messages[2].content == ""


def test_cancel_is_parsed(protocol):
    assert protocol.parse(json.dumps({"type": "cancel", "id": "r1"})) == Cancel("r1")


def test_cached_answer_uses_the_generated_event_shapes_marked_with_its_layer():
    from gateway.delivery.events import CacheMark, Done, Token, cached_events

    token, done = cached_events("r1", ["Par", "is."], "stop", {"completion_tokens": 2}, "semantic", 0.91234, 0.004)
    assert isinstance(token, Token) and isinstance(done, Done)
    assert token.index == 0 and token.text == "Paris."
    assert all(e.cached == CacheMark("semantic", 0.9123, None) and e.client_id == "r1" for e in (token, done))
    assert done.finish_reason == "stop" and done.usage == {"completion_tokens": 2}


def test_estimated_wait_is_the_work_ahead_over_the_fleets_completion_rate():
    from gateway.admission.load import LoadMonitor

    monitor = LoadMonitor(None, Settings())
    assert monitor.estimated_wait_s(0) == 0.0
    assert monitor.estimated_wait_s(5) is None  # nothing finished yet: no estimate, only the depth limit
    monitor.observe([{"instance": "a", "requests_served": 10, "running": 4, "waiting": 0}], now=monitor._at + 1)
    monitor.observe([{"instance": "a", "requests_served": 14, "running": 4, "waiting": 2}], now=monitor._at + 1)
    assert monitor.rate == pytest.approx(4.0 * 0.3, rel=1e-6)  # first sample 0 (no completions), then 4/s smoothed
    assert monitor.estimated_wait_s(10) == pytest.approx(12 / monitor.rate)
    # A worker that restarted (a new instance, its count from 0) finished nothing in this second:
    # the sample is 0 completions, not a negative one, so the rate only decays.
    before = monitor.rate
    monitor.observe([{"instance": "b", "requests_served": 0, "running": 1, "waiting": 0}], now=monitor._at + 1)
    assert monitor.rate == pytest.approx(0.7 * before, rel=1e-6)
    # Nor does a count that went backwards (a heartbeat from before a reset).
    monitor.observe([{"instance": "b", "requests_served": 3, "running": 1, "waiting": 0}], now=monitor._at + 1)
    after_three = monitor.rate
    monitor.observe([{"instance": "b", "requests_served": 1, "running": 1, "waiting": 0}], now=monitor._at + 1)
    assert monitor.rate == pytest.approx(0.7 * after_three, rel=1e-6)


def test_resume_and_deadline_fields_are_validated(protocol):
    from gateway.doors.ws_protocol import Resume

    assert protocol.parse(json.dumps({"type": "resume", "id": "abc", "after_index": 4})) == Resume("abc", 4)
    assert protocol.parse(json.dumps({"type": "resume", "id": "abc"})) == Resume("abc", -1)
    for bad in (-2, "3", True, 2**40):
        with pytest.raises(ProtocolError) as err:
            protocol.parse(json.dumps({"type": "resume", "id": "abc", "after_index": bad}))
        assert err.value.code == "invalid_field" and err.value.field == "after_index"
    with pytest.raises(ProtocolError) as err:
        protocol.parse(json.dumps({"type": "resume", "id": "abc", "prompt": "x"}))
    assert err.value.code == "unknown_field"
    assert protocol.parse(good(deadline_ms=1500)).deadline_ms == 1500
    for bad in (0, -5, 1.5, True, "100"):
        with pytest.raises(ProtocolError) as err:
            protocol.parse(good(deadline_ms=bad))
        assert err.value.field == "deadline_ms"


def test_feedback_names_a_request_and_only_known_verdicts():
    from gateway.doors.ws_protocol import Feedback

    protocol = ClientProtocol(Settings())
    assert protocol.parse(json.dumps({"type": "feedback", "id": "r1", "verdict": "wrong"})) == Feedback("r1", "wrong")
    assert protocol.parse(json.dumps({"type": "feedback", "id": "r1"})) == Feedback("r1", "wrong")
    with pytest.raises(ProtocolError) as err:
        protocol.parse(json.dumps({"type": "feedback", "id": "r1", "verdict": "meh"}))
    assert (err.value.code, err.value.field, err.value.request_id) == ("invalid_field", "verdict", "r1")
    with pytest.raises(ProtocolError) as err:
        protocol.parse(json.dumps({"type": "feedback", "id": "r1", "entry": "x"}))
    assert err.value.code == "unknown_field"
