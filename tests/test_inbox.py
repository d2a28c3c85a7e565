"""The engine's door on its own (engine/inbox.py): what any thread puts, cancels and asks, and what
the engine thread takes, with no model and no engine."""
from __future__ import annotations

import threading

import pytest

from engine.choices import RequestChoices
from engine.engine_request import RequestRejected
from engine.inbox import RequestInbox
from engine.sequence import SamplingParams


def request(request_id: str) -> RequestChoices:
    return RequestChoices(request_id, SamplingParams(), 0, [1, 2, 3], None, False, 0.0)


def test_a_request_is_held_from_the_moment_it_is_put_until_it_ends():
    inbox = RequestInbox()
    group = request("r")
    inbox.put(group)
    assert inbox.holds("r") and inbox.pending() and inbox.arrivals_waiting == 1
    assert inbox.take() == ([group], [])
    assert inbox.holds("r") and inbox.get("r") is group and not inbox.pending()
    inbox.ended("r")
    assert not inbox.holds("r") and inbox.get("r") is None


@pytest.mark.parametrize("taken", [False, True])
def test_a_second_request_under_an_id_still_in_the_engine_is_refused(taken):
    inbox = RequestInbox()
    inbox.put(request("r"))
    if taken:
        inbox.take()
    with pytest.raises(RequestRejected) as refused:
        inbox.put(request("r"))
    assert refused.value.code == "duplicate_id"


def test_a_cancel_names_the_request_it_found_and_one_for_an_unknown_id_names_none():
    inbox = RequestInbox()
    arriving, held = request("arriving"), request("held")
    inbox.put(held)
    inbox.take()
    inbox.put(arriving)
    for request_id in ("arriving", "held", "unknown"):
        inbox.cancel(request_id)
    assert inbox.take() == ([arriving], [arriving, held])


def test_a_waiting_engine_thread_wakes_when_a_request_arrives_from_another_thread():
    inbox = RequestInbox()
    waiter = threading.Thread(target=inbox.wait, args=(60.0,), name="engine-thread-waiting")
    waiter.start()
    inbox.put(request("r"))
    waiter.join(timeout=10.0)
    assert not waiter.is_alive()
