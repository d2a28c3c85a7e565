"""Scheduler mechanics on a tiny random model: admission, max-wait, join/leave, KV budget."""
from __future__ import annotations

import time

import pytest

from engine import EngineRequest, RequestRejected, SamplingParams


def req(i: str, n: int = 8, prompt: str = "hello there") -> EngineRequest:
    return EngineRequest(i, SamplingParams(max_tokens=n, ignore_eos=True), prompt=prompt)


def test_idle_engine_waits_up_to_max_wait_for_a_micro_batch(tiny_engine_factory):
    engine = tiny_engine_factory(max_batch=4, max_wait_ms=300)
    engine.add_request(req("a"))
    assert engine.step() == []  # waits for company
    assert 0 < engine.scheduler.seconds_until_admission() <= 0.3
    time.sleep(0.31)
    first = engine.step()
    assert [u.request_id for u in first] == ["a"] and first[0].index == 0


def test_full_micro_batch_is_prefilled_at_once_without_waiting(tiny_engine_factory):
    engine = tiny_engine_factory(max_batch=4, max_wait_ms=10_000)
    for i in range(4):
        engine.add_request(req(f"r{i}"))
    updates = engine.step()
    assert sorted(u.request_id for u in updates) == ["r0", "r1", "r2", "r3"]
    assert all(u.index == 0 for u in updates)


def test_new_request_joins_the_running_batch_at_the_next_step(tiny_engine_factory):
    engine = tiny_engine_factory(max_batch=4, max_wait_ms=0)
    engine.add_request(req("a", 20))
    engine.add_request(req("b", 20))
    for _ in range(3):
        engine.step()
    engine.add_request(req("late", 20))
    joined = engine.step()
    assert [(u.request_id, u.index) for u in joined] == [("late", 0)]
    decoded = engine.step()
    assert sorted(u.request_id for u in decoded) == ["a", "b", "late"]


def test_finished_sequence_leaves_the_batch_at_once(tiny_engine_factory):
    engine = tiny_engine_factory(max_batch=4, max_wait_ms=0)
    engine.add_request(req("short", 2))
    engine.add_request(req("long", 10))
    engine.step()  # prefill: first token of each
    updates = engine.step()
    assert {u.request_id: u.finish_reason for u in updates}["short"] == "length"
    assert [s.request_id for s in engine.scheduler.running] == ["long"]
    assert [u.request_id for u in engine.step()] == ["long"]


def test_request_that_does_not_fit_the_kv_budget_waits_for_memory(tiny_engine_factory):
    # Each request needs <= 128 positions, so the budget holds exactly two rows of 128.
    engine = tiny_engine_factory(max_batch=4, max_wait_ms=0, kv_budget_tokens=256)
    for i in range(3):
        engine.add_request(req(f"r{i}", 30))
    engine.step()
    assert len(engine.scheduler.running) == 2 and len(engine.scheduler.waiting) == 1
    assert engine.kv.used_tokens <= 256
    seen_third = False
    while engine.has_work():
        for u in engine.step():
            seen_third |= u.request_id == "r2"
        assert engine.kv.used_tokens <= 256
    assert seen_third


def test_request_that_can_never_fit_is_refused(tiny_engine_factory):
    engine = tiny_engine_factory(max_batch=4, kv_budget_tokens=256)
    with pytest.raises(RequestRejected) as refused:
        engine.add_request(req("big", 300))
    assert refused.value.code == "context_overflow"


def test_budget_in_bytes_is_converted_to_tokens(tiny_engine_factory):
    engine = tiny_engine_factory(kv_budget_bytes=1_000_000)
    assert engine.kv.budget_tokens == 1_000_000 // engine.kv_shape.bytes_per_token


def test_cancelled_waiting_request_never_runs(tiny_engine_factory):
    engine = tiny_engine_factory(max_batch=1, max_wait_ms=0)
    engine.add_request(req("running", 5))
    engine.step()
    engine.add_request(req("queued", 5))
    engine.cancel("queued")
    updates = engine.step()
    assert ("queued", None, "cancelled") in [(u.request_id, u.index, u.finish_reason) for u in updates]
    while engine.has_work():
        assert all(u.request_id != "queued" for u in engine.step())


def test_duplicate_request_id_is_refused(tiny_engine_factory):
    engine = tiny_engine_factory()
    engine.add_request(req("same"))
    with pytest.raises(RequestRejected) as refused:
        engine.add_request(req("same"))
    assert refused.value.code == "duplicate_id"
