"""The WebSocket protocol's wire format, pinned: each client event (gateway/delivery/events.py)
as the exact JSON text the WebSocket door sends (`json.dumps(event.wire())`), key order included,
as clients have always been sent it (docs/websocket.md). A change here breaks clients that compare
frames byte for byte."""
from __future__ import annotations

import json

import pytest

from gateway.delivery.events import (
    ClientEvent,
    Done,
    FeedbackRecorded,
    Queued,
    Refused,
    StreamError,
    Token,
    cached_events,
)
from gateway.request import ProtocolError

LOGPROBS = {"token": "yes", "id": 7003, "logprob": -0.11, "top": [["yes", -0.11, 7003]]}


@pytest.mark.parametrize("event, text", [
    (Queued("a1", "r9"),
     '{"type": "queued", "id": "a1", "request_id": "r9"}'),
    (Token("a1", 0, "The"),
     '{"type": "token", "id": "a1", "index": 0, "text": "The"}'),
    (Token("t1", 3, "yes", 1, LOGPROBS, [None], "stop", {"prompt_tokens": 5, "completion_tokens": 4}),
     '{"type": "token", "id": "t1", "index": 3, "text": "yes", "choice": 1, "logprobs": {"token": "yes", "id": 7003, '
     '"logprob": -0.11, "top": [["yes", -0.11, 7003]]}, "prompt_logprobs": [null], "finish_reason": "stop", '
     '"usage": {"prompt_tokens": 5, "completion_tokens": 4}}'),
    (Done("a1", "stop", {"prompt_tokens": 31, "completion_tokens": 8}, {"e2e_s": 0.7, "worker": "w1"}, "smollm2", "v1"),
     '{"type": "done", "id": "a1", "finish_reason": "stop", "usage": {"prompt_tokens": 31, "completion_tokens": 8}, '
     '"timing": {"e2e_s": 0.7, "worker": "w1"}, "model": "smollm2", "version": "v1"}'),
    (Done("t1", "length", {"completion_tokens": 2}, None, finish_reasons=["length", "stop"]),
     '{"type": "done", "id": "t1", "finish_reason": "length", "usage": {"completion_tokens": 2}, "timing": {}, '
     '"finish_reasons": ["length", "stop"]}'),
    (Done.cancelled("a1"),
     '{"type": "done", "id": "a1", "finish_reason": "cancelled", "usage": {}, "timing": {}}'),
    (StreamError("a1", "worker_failed", "the worker stopped"),
     '{"type": "error", "id": "a1", "code": "worker_failed", "message": "the worker stopped"}'),
    (Refused("overloaded", "busy", "a1", "max_tokens", 1.23456),
     '{"type": "error", "code": "overloaded", "message": "busy", "id": "a1", "field": "max_tokens", '
     '"retry_after_s": 1.235}'),
    (Refused("bad_json", "not JSON"),
     '{"type": "error", "code": "bad_json", "message": "not JSON"}'),
    (FeedbackRecorded("f1", "e7", True),
     '{"type": "feedback_recorded", "id": "f1", "entry": "e7", "evicted": true}'),
])
def test_each_event_is_sent_as_the_json_the_protocol_always_had(event: ClientEvent, text: str):
    assert json.dumps(event.wire()) == text


def test_a_cached_answer_is_sent_as_a_generated_one_marked_with_its_layer_then_its_entry_and_model():
    token, done = cached_events("c1", ["Par", "is."], "stop", {"prompt_tokens": 3, "completion_tokens": 2},
                                "semantic", 0.912345, 0.0015, "e7", request_id="r5", model="smollm2", version="v2",
                                continuous_usage=True)
    assert json.dumps(token.wire()) == (
        '{"type": "token", "id": "c1", "index": 0, "text": "Paris.", "usage": {"prompt_tokens": 3, '
        '"completion_tokens": 2}, "cached": "semantic", "similarity": 0.9123, "request_id": "r5"}')
    assert json.dumps(done.wire()) == (
        '{"type": "done", "id": "c1", "finish_reason": "stop", "usage": {"prompt_tokens": 3, "completion_tokens": 2}, '
        '"timing": {"queue_s": 0.0, "ttft_s": 0.0015, "e2e_s": 0.0015, "worker": null}, "cached": "semantic", '
        '"similarity": 0.9123, "request_id": "r5", "entry": "e7", "model": "smollm2", "version": "v2"}')


def test_an_empty_cached_answer_is_its_done_alone_and_names_no_entry_or_model_it_lacks():
    [done] = cached_events("c1", [], "stop", {}, "exact", 1.0, 0.001)
    assert json.dumps(done.wire()) == (
        '{"type": "done", "id": "c1", "finish_reason": "stop", "usage": {}, "timing": {"queue_s": 0.0, '
        '"ttft_s": 0.001, "e2e_s": 0.001, "worker": null}, "cached": "exact", "similarity": 1.0, "request_id": null, '
        '"entry": null}')


def test_a_refused_message_is_sent_as_its_protocol_error_says():
    err = ProtocolError("rate_limited", "slow down", "a1", retry_after_s=2.0)
    assert json.dumps(err.event().wire()) == (
        '{"type": "error", "code": "rate_limited", "message": "slow down", "id": "a1", "retry_after_s": 2.0}')
