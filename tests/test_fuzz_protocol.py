"""Fuzzing the client protocol with hypothesis, in the pure parser and over a real socket.

What it proves:
- Pure: for random bytes, random text, arbitrary JSON (huge ints, NaN/Infinity, control, non-BMP
  and lone surrogate characters, deep nesting) and generate/cancel/resume/unknown commands with
  valid and hostile field values, `ClientProtocol.parse` raises nothing but ProtocolError, always
  with a known code, a message and a JSON-serialisable `error` event; a command it accepts holds
  no lone surrogate; a valid generate frame parses to a Generate carrying exactly the fields sent.
- Wire: on one connection to a real gateway (real worker, real model, real Redis), hostile frames
  sent while a good request streams are each answered with exactly one error, in order, with the
  code the parser gives; the connection stays open and the good stream is complete and in order.
  A frame that parses as a valid generate is not sent (it would start a request); valid `cancel`
  and `resume` frames are, as their ids are unknown: they are errors too.
"""
from __future__ import annotations

import asyncio
import json
import sys

import pytest
from hypothesis import HealthCheck, Phase, assume, given, settings
from hypothesis import strategies as st
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed

from gateway.doors.ws_protocol import Cancel, ClientProtocol
from gateway.request import Generate, ProtocolError
from ops.core.messages import SAMPLING_FIELDS
from ops.core.settings import Settings
from tests.clients import Answer, absorb
from tests.services import Stack

SETTINGS = Settings()
PROTOCOL = ClientProtocol(SETTINGS)
PARSER_CODES = {"binary_frame", "invalid_json", "invalid_message", "missing_field", "unknown_type",
                "invalid_field", "unknown_field", "model_not_found", "prompt_too_long"}
GOOD = {"type": "generate", "id": "good", "prompt": "Count from one to twenty.", "max_tokens": 200}
END = "fuzz-end"  # cancel of this unknown id follows the hostile frames: its error marks the end
HOSTILE = 150


def dumps(value, ensure_ascii: bool = True) -> str:
    """json.dumps that can also write ints past Python's 4300-digit str() limit."""
    limit = sys.get_int_max_str_digits()
    sys.set_int_max_str_digits(0)
    try:
        return json.dumps(value, ensure_ascii=ensure_ascii)
    finally:
        sys.set_int_max_str_digits(limit)


# ---- strategies ------------------------------------------------------------------------------------

# Valid Unicode with control, separator and BOM characters often; ANY_CHARS adds lone surrogates
# (JSON can carry them as \ud800; Redis and the tokenizer cannot take them). The .map keeps
# hypothesis from merging the alphabets into one uniform range, where the specials would be rare.
CHARS = st.characters(codec="utf-8") | st.sampled_from("\x00\x1f\x7f\u2028\ufeff").map(str)
ANY_CHARS = CHARS | st.sampled_from("\ud800\udbff\udc00\udfff").map(str)
HUGE_INTS = st.builds(lambda n, sign: sign * 10**n, st.integers(4290, 4400), st.sampled_from([1, -1]))
HUGE_STRS = st.integers(65_000, 300_000).map(lambda n: "x" * n)  # around max_prompt_chars
SCALARS = st.none() | st.booleans() | st.integers() | HUGE_INTS | st.floats() | st.text(ANY_CHARS, max_size=40)
JSON = st.recursive(
    SCALARS, lambda kids: st.lists(kids, max_size=4) | st.dictionaries(st.text(ANY_CHARS, max_size=8), kids, max_size=4),
    max_leaves=20,
)
BAD_VALUES = JSON | HUGE_STRS | st.sampled_from(
    [True, False, -1, 0, 1.5, -(2**63), 2**63, 2**64, 10**30, 1e308, -0.0, "", " ", "\x00", "\n\t", [], {}, [None]]
)
IDS = st.text(CHARS, min_size=1, max_size=SETTINGS.max_id_chars)
ANY_IDS = st.text(ANY_CHARS, min_size=1, max_size=SETTINGS.max_id_chars)
MESSAGES = st.lists(st.fixed_dictionaries({"role": st.sampled_from(["system", "user", "assistant"]),
                                           "content": st.text(CHARS, min_size=1, max_size=50).filter(str.strip)}),
                    min_size=1, max_size=4)
VALID = {  # a valid value for every field of every command
    "type": st.sampled_from(["generate", "cancel", "resume", "feedback", "random"]),
    "id": IDS,
    "prompt": st.text(CHARS, min_size=1, max_size=200).filter(str.strip),
    "messages": MESSAGES,
    "model": st.just(SETTINGS.model_name),
    "cache": st.sampled_from(["auto", "off", "exact"]),
    "cache_threshold": st.floats(0, 1),
    "deadline_ms": st.integers(1, 24 * 3600 * 1000),
    "max_tokens": st.integers(1, SETTINGS.max_tokens_limit),
    "temperature": st.floats(0, 2),
    "top_p": st.floats(0, 1, exclude_min=True),
    "top_k": st.integers(0, 1000),
    "repetition_penalty": st.floats(0, 10, exclude_min=True),
    "stop": st.lists(st.text(CHARS, min_size=1, max_size=SETTINGS.max_stop_chars), max_size=SETTINGS.max_stop_strings),
    "seed": st.integers(0, 2**63 - 1),
    "after_index": st.integers(-1, 2**31 - 1),
}
KNOWN_NAMES = st.sampled_from(sorted(VALID))
FIELD_NAMES = st.one_of(KNOWN_NAMES, KNOWN_NAMES, KNOWN_NAMES, st.text(ANY_CHARS, max_size=12))  # 3 in 4 known


@st.composite
def commands(draw) -> dict:
    """A command of any type whose fields are changed, dropped, or added, valid or hostile."""
    frame = {"type": draw(VALID["type"]), "id": draw(IDS | ANY_IDS)}
    if frame["type"] == "generate":
        frame["prompt"] = draw(VALID["prompt"])
    for name in draw(st.lists(FIELD_NAMES, max_size=6)):
        if draw(st.integers(0, 9)) == 0:
            frame.pop(name, None)
        else:
            frame[name] = draw(st.one_of(VALID.get(name, st.nothing()), BAD_VALUES))
    return frame


DEEP = st.builds(  # nesting below and past the JSON decoder's recursion limit, as raw text; not near
    # it, where the outcome depends on the caller's stack depth (this test's and the gateway's differ)
    lambda kind, name, n: '{"type": %s, "id": "deep", %s: %s}' % (dumps(kind), dumps(name), "[" * n + "]" * n),
    VALID["type"], FIELD_NAMES, st.integers(1, 700) | st.integers(1200, 3000),
)
BARE = st.fixed_dictionaries(  # cancel and resume, mostly valid: over the wire, of unknown ids
    {"type": st.sampled_from(["cancel", "resume", "feedback"]), "id": ANY_IDS}, optional={"after_index": VALID["after_index"]})
FRAMES = st.one_of(
    st.binary(max_size=64), st.text(ANY_CHARS, max_size=64), st.builds(dumps, JSON, st.booleans()),
    st.builds(dumps, commands(), st.booleans()), st.builds(dumps, BARE, st.booleans()), DEEP,
)
VALID_GENERATES = st.builds(
    lambda base, body: {**base, **body},
    st.fixed_dictionaries({"type": st.just("generate"), "id": IDS}, optional={
        k: v for k, v in VALID.items() if k not in ("type", "id", "prompt", "messages", "after_index")}),
    st.fixed_dictionaries({"prompt": VALID["prompt"]}) | st.fixed_dictionaries({"messages": MESSAGES}),
)


# ---- pure ------------------------------------------------------------------------------------------

@settings(max_examples=500, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(FRAMES)
def test_any_frame_parses_or_gets_a_named_error(frame):
    try:
        cmd = PROTOCOL.parse(frame)
    except ProtocolError as err:
        assert err.code in PARSER_CODES and isinstance(err.message, str) and err.message
        event = json.loads(json.dumps(err.event().wire()))
        assert event["type"] == "error" and event["code"] == err.code and event["message"] == err.message
    else:  # an accepted command carries valid Unicode only: Redis (keys) and the tokenizer need it
        texts = [cmd.id]
        if isinstance(cmd, Generate):
            texts += [cmd.prompt or "", *(m.content for m in cmd.messages or []), *cmd.params.stop]
        for text in texts:
            assert not any(0xD800 <= ord(c) <= 0xDFFF for c in text), f"lone surrogate accepted in {text!r}"


@settings(max_examples=300, deadline=None)
@given(VALID_GENERATES, st.booleans())
def test_a_valid_generate_parses_with_the_fields_sent(frame, ensure_ascii):
    text = dumps(frame, ensure_ascii)
    frame = json.loads(text)  # as the gateway reads it
    cmd = PROTOCOL.parse(text)
    assert isinstance(cmd, Generate) and cmd.id == frame["id"] and cmd.prompt == frame.get("prompt")
    assert ([m.model_dump(exclude_none=True) for m in cmd.messages] if cmd.messages else None) == frame.get("messages")
    assert cmd.model == SETTINGS.model_name and cmd.cache == frame.get("cache", "auto")
    assert cmd.cache_threshold == frame.get("cache_threshold") and cmd.deadline_ms == frame.get("deadline_ms")
    for name, value in cmd.params.model_dump().items():
        # A sampling field the frame leaves out stays unset (admission fills it for the version it
        # routes to); every other field takes its declared default.
        unset = (None if name in SAMPLING_FIELDS
                 else type(cmd.params).model_fields[name].get_default(call_default_factory=True))
        assert value == frame.get(name, unset)


# ---- over the wire ---------------------------------------------------------------------------------

def expected_code(frame: str | bytes) -> str | None:
    """The error code the gateway should answer with; None for a frame not to send: a valid generate,
    one naming the good request, one over 1 MB (max_message_bytes closes), a lone surrogate."""
    try:
        if len(frame if isinstance(frame, bytes) else frame.encode()) >= 1_000_000:
            return None
    except UnicodeEncodeError:
        return None
    try:
        cmd = PROTOCOL.parse(frame)
    except ProtocolError as err:
        return None if err.request_id in ("good", END) else err.code
    except Exception:  # noqa: BLE001 - the parser itself breaks (test_any_frame_parses_or_gets_a_named_error
        # fails on that frame): the gateway must still answer it, with its one code for a bug
        return "internal_error"
    if cmd.id in ("good", END) or isinstance(cmd, Generate):
        return None
    return "unknown_id" if isinstance(cmd, Cancel) else "unknown_request"


def draw_hostile_frames(n: int) -> list[str | bytes]:
    """n frames from FRAMES that must each get one error: hypothesis draws, the test collects."""
    frames: list[str | bytes] = []

    @settings(max_examples=n, database=None, deadline=None, phases=[Phase.generate],
              suppress_health_check=list(HealthCheck))
    @given(FRAMES)
    def draw(frame):
        assume(expected_code(frame) is not None)
        frames.append(frame)

    draw()
    return frames


@pytest.fixture(scope="module")
def wire(redis_server, tiny_model_dir, tmp_path_factory):
    # The wire's mechanics need no real answers: the tiny model, whose GOOD answer (200 tokens)
    # is still streaming while the hostile frames arrive.
    with Stack(redis_server, tmp_path_factory.mktemp("fuzz-logs"), BRIGADE_CACHE_ENABLED="0",
               BRIGADE_WORKER_CONCURRENCY="8", BRIGADE_MODEL=str(tiny_model_dir), BRIGADE_TORCH_THREADS="1") as stack:
        stack.start_gateway()
        stack.start_worker("fuzz@test")
        stack.wait_ready()
        yield stack


async def exchange(url: str, frames: list[str | bytes]) -> tuple[Answer, list[dict], list[dict], str | None]:
    """Start GOOD, send the frames once it streams, read to its end; the errors, other events, close."""
    answers, errors, other = {"good": Answer("good")}, [], []
    good = answers["good"]

    async def send_all(ws) -> None:
        try:
            for frame in [*frames, json.dumps({"type": "cancel", "id": END})]:
                await ws.send(frame)
        except ConnectionClosed:
            pass  # the reader reports it

    try:
        async with connect(url, max_size=None) as ws:
            await ws.send(json.dumps(GOOD))
            while not good.tokens and good.end is None:
                absorb(answers, json.loads(await ws.recv()))
            sender, end_seen = asyncio.create_task(send_all(ws)), False
            while good.end is None or not end_seen:
                event = json.loads(await ws.recv())
                if event.get("id") == "good":
                    absorb(answers, event)
                elif event["type"] == "error" and event.get("id") == END:
                    end_seen = True
                else:
                    (errors if event["type"] == "error" else other).append(event)
            await sender
            await asyncio.wait_for(await ws.ping(), 10)
    except ConnectionClosed as exc:
        return good, errors, other, f"closed the connection ({exc})"
    return good, errors, other, None


async def first_fatal(url: str, frames: list[str | bytes]) -> int | None:
    """Send frames one at a time, each awaiting its answer: the index of the first that closes."""
    async with connect(url, max_size=None) as ws:
        for i, frame in enumerate(frames):
            try:
                await ws.send(frame)
                await asyncio.wait_for(ws.recv(), 10)
            except ConnectionClosed:
                return i
    return None


def test_hostile_frames_mid_stream_each_get_one_error_and_spare_the_stream(wire):
    url = wire.url
    frames = draw_hostile_frames(HOSTILE)
    assert len(frames) == HOSTILE, f"hypothesis drew {len(frames)} hostile frames of {HOSTILE}"
    expected = [expected_code(f) for f in frames]
    try:
        good, errors, other, closed = asyncio.run(asyncio.wait_for(exchange(url, frames), 180))
        if closed:  # errors come in frame order, though the last few may be lost in the close
            i = asyncio.run(first_fatal(url, frames[len(errors):]))
            i = None if i is None else len(errors) + i
            raise AssertionError(f"the gateway {closed} after answering {len(errors)} of {len(frames)} frames; "
                                 f"alone, frame #{i} closes it (expected {expected[i] if i is not None else None}; "
                                 f"internal_error = the parser raises): {frames[i] if i is not None else None!r:.400}")
        assert not other, f"unexpected events: {other[:5]}"
        assert good.end["type"] == "done" and good.end["finish_reason"] in ("stop", "length"), good.end
        assert good.indexes == list(range(len(good.tokens))), good.indexes
        assert len(errors) == len(frames), f"{len(errors)} errors for {len(frames)} hostile frames"
        for frame, code, event in zip(frames, expected, errors):
            assert event["code"] == code, f"frame {frame[:200]!r}: want {code}, got {event}"
    except BaseException:
        print(wire.tails())
        raise
