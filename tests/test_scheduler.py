"""Scheduler mechanics on a tiny random model: admission, max-wait, join/leave, KV budget. The
scheduler is pure policy: it imports no torch (the KV owner allocates and copies)."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from engine import Engine, EngineConfig, EngineRequest, RequestRejected, SamplingParams
from engine.scheduler import Scheduler, SchedulerConfig
from engine.sequence import Sequence
from tests.clock import HandClock

ROOT = Path(__file__).resolve().parent.parent


def req(i: str, n: int = 8, prompt: str = "hello there") -> EngineRequest:
    return EngineRequest(i, SamplingParams(max_tokens=n, ignore_eos=True), prompt=prompt)


def test_idle_engine_waits_up_to_max_wait_for_a_micro_batch(tiny_model_dir):
    clock = HandClock()
    engine = Engine.load(EngineConfig(model=str(tiny_model_dir), max_batch=4, max_wait_ms=300, torch_threads=1,
                                      dtype="float32"), clock=clock)
    engine.add_request(req("a"))
    assert engine.step() == []  # waits for company
    assert engine.scheduler.seconds_until_admission() == pytest.approx(0.3)
    clock.advance(0.29)
    assert engine.step() == []  # still within max_wait
    assert engine.scheduler.seconds_until_admission() == pytest.approx(0.01)
    clock.advance(0.01)
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
    joined = engine.step()  # its prefill rides in the same pass as the others' decode
    assert sorted((u.request_id, u.index) for u in joined) == [("a", 3), ("b", 3), ("late", 0)]
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


# ---- lanes: batch work fills the rows interactive work leaves ---------------------------------------


def batch_req(i: str, n: int = 8, prompt: str = "hello there") -> EngineRequest:
    return EngineRequest(i, SamplingParams(max_tokens=n, ignore_eos=True), prompt=prompt, batch=True)


def run_to_end(engine, ids: set[str], tokens: dict[str, list[int]] | None = None) -> dict[str, list[int]]:
    tokens = tokens if tokens is not None else {}
    ended: set[str] = set()
    for _ in range(500):
        collect(engine.step(), tokens, ended)
        if ids <= ended:
            return tokens
    raise AssertionError(f"not finished: {ids - ended}")


def collect(updates, tokens: dict[str, list[int]], ended: set[str] | None = None) -> list:
    for u in updates:
        if u.token_id is not None:
            tokens.setdefault(u.request_id, []).append(u.token_id)
        if u.finish_reason is not None and ended is not None:
            ended.add(u.request_id)
    return updates


def test_waiting_interactive_requests_are_admitted_before_waiting_batch_ones(tiny_engine_factory):
    engine = tiny_engine_factory(max_batch=2, max_wait_ms=0)
    engine.add_request(batch_req("b1"))
    engine.add_request(batch_req("b2"))
    engine.add_request(req("i1"))
    first = engine.step()
    assert sorted(u.request_id for u in first) == ["b1", "i1"]  # i1 jumped ahead of b2


@pytest.mark.real_model
def test_an_interactive_arrival_preempts_the_newest_batch_row_which_later_ends_as_if_never_stopped(model_dir):
    """The real model, greedy: a preempted row's answer is token for token the uninterrupted one."""
    def engine():
        return Engine.load(EngineConfig(model=str(model_dir), max_batch=3, max_wait_ms=0, torch_threads=1,
                                        dtype="float32"))

    questions = {"b0": "Name three rivers in Europe.", "b1": "What is a prime number?",
                 "b2": "Describe a cat in one sentence."}

    def batch_question(rid: str) -> EngineRequest:
        return EngineRequest(rid, SamplingParams(max_tokens=16), messages=[{"role": "user", "content": questions[rid]}],
                             batch=True)

    alone = engine()
    for rid in questions:
        alone.add_request(batch_question(rid))
    expected = run_to_end(alone, set(questions))

    busy = engine()
    tokens: dict[str, list[int]] = {}
    for rid in questions:
        busy.add_request(batch_question(rid))
    for _ in range(4):  # the three batch rows fill the engine and decode a while
        collect(busy.step(), tokens)
    assert len(busy.scheduler.running) == 3
    busy.add_request(EngineRequest("live", SamplingParams(max_tokens=4), prompt="Hello"))
    joined = collect(busy.step(), tokens)
    assert "live" in [u.request_id for u in joined]  # admitted at once, not after a batch row ends
    assert busy.scheduler.preemptions == 1
    assert [s.request_id for s in busy.scheduler.waiting] == ["b2"]  # the last admitted of the three
    run_to_end(busy, set(questions) | {"live"}, tokens)
    # The preempted row was prefilled again (prompt and tokens so far) and went on as before.
    assert {rid: tokens[rid] for rid in questions} == expected
    assert busy.stats()["preemptions"] == 1


def test_interactive_requests_never_preempt_each_other(tiny_engine_factory):
    engine = tiny_engine_factory(max_batch=2, max_wait_ms=0)
    engine.add_request(req("i1", 10))
    engine.add_request(req("i2", 10))
    engine.step()
    engine.add_request(req("i3", 10))
    assert all(u.request_id != "i3" for u in engine.step())
    assert engine.scheduler.preemptions == 0


@pytest.mark.parametrize("batch_invariant", [False, True])
def test_a_prompt_longer_than_one_pass_is_loaded_over_passes_that_sample_nothing(tiny_engine_factory, batch_invariant):
    # max_prefill_tokens 8 and nothing decoding: the first passes reach no context's end, so
    # they have no row to sample (the head runs on none), and the last one gives the first token.
    engine = tiny_engine_factory(max_prefill_tokens=8, prefill_chunk_tokens=8, max_wait_ms=0,
                                 batch_invariant=batch_invariant)
    prompt = list(range(3, 43))  # 40 tokens: five passes
    done = engine.generate([EngineRequest("long", SamplingParams(max_tokens=3, ignore_eos=True), prompt_ids=prompt)])
    assert done["long"].finish_reason == "length" and len(done["long"].token_ids) == 3


def imported_by(modules: list[str]) -> set[str]:
    """The top-level packages loaded by importing these engine modules alone, in a fresh
    interpreter. engine/__init__.py is bypassed: it gathers the public API, which needs torch."""
    probe = (
        "import importlib, json, sys, types\n"
        f"package = types.ModuleType('engine'); package.__path__ = [{str(ROOT / 'engine')!r}]\n"
        "sys.modules['engine'] = package\n"
        f"for name in {modules!r}: importlib.import_module(name)\n"
        "print(json.dumps(sorted({m.split('.')[0] for m in sys.modules})))\n"
    )
    out = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, check=True)
    return set(json.loads(out.stdout))


def test_the_scheduler_and_the_prefix_accounting_import_no_torch_or_transformers():
    assert {"torch", "transformers"} & imported_by(["engine.scheduler", "engine.prefix_index"]) == set()
    # The probe sees torch where it is: the KV owner allocates tensors.
    assert "torch" in imported_by(["engine.kv_allocator"])


# ---- the policy alone: a KV owner that counts rows, no tensors ---------------------------------------


class RowsOfMemory:
    """A KV owner with room for `rows` sequences, whatever their length (what the scheduler asks
    of engine/kv_allocator.KVAllocator, without tensors)."""

    def __init__(self, rows: int):
        self.free = rows

    def allocate(self, seq) -> bool:
        if not self.free:
            return False
        self.free -= 1
        seq.kv, seq.num_computed = object(), 0
        return True

    def room_for_next(self, seq) -> bool:
        return True

    def remember(self, seq) -> None:
        pass

    def release(self, seq, remember: bool = False) -> None:
        if seq.kv is not None:
            self.free += 1
        seq.kv, seq.num_computed = None, 0


def test_the_scheduler_decides_alone_an_interactive_arrival_preempts_the_newest_batch_row():
    clock = HandClock()
    scheduler = Scheduler(SchedulerConfig(max_batch=4, max_wait_ms=0), RowsOfMemory(2), clock)

    def arrive(rid: str, batch: bool) -> Sequence:
        seq = Sequence(rid, [5, 6, 7], SamplingParams(max_tokens=4), seed=0, batch=batch, arrived=clock())
        scheduler.add(seq)
        clock.advance(0.001)
        return seq

    def step() -> list[str]:
        """One pass: every chunk computed, a token for each that reaches its context's end."""
        chunks = scheduler.schedule()
        scheduler.computed(chunks)
        for c in chunks:
            if c.samples:
                c.seq.output_ids.append(9)
        return sorted(c.seq.request_id for c in chunks)

    arrive("b1", batch=True)
    arrive("b2", batch=True)
    assert step() == ["b1", "b2"]
    assert [s.request_id for s in scheduler.running] == ["b1", "b2"]
    arrive("live", batch=False)
    assert step() == ["b1", "live"]  # b1 decodes beside the new prompt
    assert scheduler.preemptions == 1 and [s.request_id for s in scheduler.waiting] == ["b2"]
    b2 = scheduler.waiting[0]
    assert b2.num_computed == 0 and b2.output_ids == [9]  # its cache given back, its token kept
    scheduler.leave(scheduler.running[0], remember=True)
    assert step() == ["b2", "live"]  # the freed row goes to it
    assert b2.num_computed == 4 and b2.output_ids == [9, 9]  # prefilled again, prompt and token, in one pass
