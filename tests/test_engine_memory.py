"""KV memory on a tiny random model (float32, so that tokens compare exactly): prefix reuse,
chunked prefill, admission that one large request cannot hold hostage, preemption when running
sequences outgrow the memory, and the prefix cache giving way to them."""
from __future__ import annotations

import random

from engine import Engine, EngineConfig, EngineRequest, SamplingParams
from tests.clock import HandClock


def ids_req(i: str, ids: list[int], n: int = 12) -> EngineRequest:
    return EngineRequest(i, SamplingParams(max_tokens=n, ignore_eos=True), prompt_ids=ids)


def words(k: int, seed: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(3, 40_000) for _ in range(k)]


def run(engine, requests: list[EngineRequest], join_after: dict[str, int] | None = None) -> dict[str, list[int]]:
    """Serve requests to the end; join_after[rid] = steps to wait before adding that one."""
    join_after = join_after or {}
    pending = {r.request_id: r for r in requests}
    tokens: dict[str, list[int]] = {r.request_id: [] for r in requests}
    ended: set[str] = set()
    for step in range(5000):
        for rid, r in list(pending.items()):
            if join_after.get(rid, 0) <= step:
                engine.add_request(r)
                del pending[rid]
        for u in engine.step():
            if u.token_id is not None:
                tokens[u.request_id].append(u.token_id)
            if u.finish_reason is not None:
                ended.add(u.request_id)
        assert engine.kv.used_tokens <= engine.kv.budget_tokens
        if not pending and len(ended) == len(requests):
            return tokens
    raise AssertionError(f"not finished: {set(tokens) - ended}")


# ---- prefix reuse ---------------------------------------------------------------------------------


def test_a_shared_prefix_is_reused_and_gives_the_same_tokens(tiny_engine_factory):
    system = words(150, seed=1)
    first, second = ids_req("first", system + words(7, 2)), ids_req("second", system + words(9, 3))
    plain = tiny_engine_factory(max_wait_ms=0, prefix_cache=False)
    expected = {**run(plain, [first]), **run(plain, [second])}
    assert plain.stats()["prefix_hit_tokens"] == 0

    cached = tiny_engine_factory(max_wait_ms=0)
    assert run(cached, [first]) == {"first": expected["first"]}
    hits_before = cached.stats()["prefix_hit_tokens"]
    assert run(cached, [second]) == {"second": expected["second"]}
    # 150 shared tokens = 4 whole blocks of 32 found, 128 tokens not recomputed.
    assert cached.stats()["prefix_hit_tokens"] - hits_before == 128


def test_a_finished_answer_is_reused_by_the_next_turn(tiny_engine_factory):
    engine = tiny_engine_factory(max_wait_ms=0)
    turn = words(40, seed=4)
    answer = run(engine, [ids_req("t1", turn, n=60)])["t1"]
    before = engine.stats()["prefix_hit_tokens"]
    run(engine, [ids_req("t2", turn + answer + words(5, 5))])
    # The first turn and its answer (computed up to the answer's last token) were remembered.
    assert engine.stats()["prefix_hit_tokens"] - before == (len(turn) + len(answer) - 1) // 32 * 32


def test_the_prefix_cache_gives_way_to_running_sequences(tiny_engine_factory):
    engine = tiny_engine_factory(max_wait_ms=0, kv_budget_tokens=1024)
    for i in range(6):  # six distinct prompts of 96 tokens remembered: 6 x 3 blocks of 32
        run(engine, [ids_req(f"fill{i}", words(96, seed=10 + i), n=1)])
    assert engine.prefix.cached_tokens >= 512
    # Two sequences growing to 384 positions each need 768 of the 1,024 tokens.
    tokens = run(engine, [ids_req(f"big{i}", words(200, seed=20 + i), n=150) for i in range(2)])
    assert all(len(t) == 150 for t in tokens.values())
    assert engine.scheduler.preemptions == 0  # the cache was evicted instead


def test_a_growing_answer_is_charged_step_by_step_and_copied_only_past_its_spare_positions(tiny_engine_factory):
    # A copy of the whole cache is a stream's longest gap between tokens: the tensor has room for
    # SPARE_POSITIONS more than the budget is charged for, and the capacity grows into it in place.
    from engine.kv_cache import CAPACITY_STEP, SPARE_POSITIONS

    engine = tiny_engine_factory(max_wait_ms=0, prefix_cache=False)  # the budget holds this one sequence alone
    engine.add_request(ids_req("long", words(100, 60), n=700))
    seen: list[tuple[int, int, int]] = []  # (capacity, charged tokens, tensor address) whenever one changes
    while engine.has_work():
        engine.step()
        running = engine.scheduler.running
        if running:
            kv = running[0].kv
            now = (kv.capacity, engine.kv.used_tokens, kv.data.data_ptr())
            if not seen or now != seen[-1]:
                seen.append(now)
    capacities = [c for c, _, _ in seen]
    assert capacities == list(range(CAPACITY_STEP, 7 * CAPACITY_STEP + 1, CAPACITY_STEP))  # a step at a time, as before
    assert all(used == capacity for capacity, used, _ in seen)  # the budget holds the capacity, not the tensor
    copied_at = [c for (c, _, a), (_, _, before) in zip(seen[1:], seen) if a != before]
    # Made with 128 + 3 spare steps; copied once, at 640, into a tensor as large as it may ever need (896).
    assert SPARE_POSITIONS == 3 * CAPACITY_STEP and copied_at == [5 * CAPACITY_STEP]


# ---- chunked prefill --------------------------------------------------------------------------


def test_chunked_prefill_gives_the_same_tokens_and_keeps_running_streams_going(tiny_engine_factory):
    stream, long = ids_req("stream", words(5, 6), n=80), ids_req("long", words(600, 7), n=8)
    whole = tiny_engine_factory(max_wait_ms=0, prefill_chunk_tokens=4096)
    chunked = tiny_engine_factory(max_wait_ms=0, prefill_chunk_tokens=32)
    expected = run(whole, [stream, long], join_after={"long": 5})
    assert run(chunked, [stream, long], join_after={"long": 5}) == expected

    # While the long prompt loads (600 tokens, 32 a step), the stream gets a token every step.
    engine = tiny_engine_factory(max_wait_ms=0, prefill_chunk_tokens=32)
    engine.add_request(ids_req("stream", words(5, 6), n=80))
    for _ in range(3):
        engine.step()
    engine.add_request(ids_req("long", words(600, 7), n=8))
    decode_rows = []  # what the worker's batch-size metric is told: the stream, in every step
    engine.on_step = decode_rows.append
    steps = 0
    while True:
        updates = engine.step()
        steps += 1
        assert "stream" in [u.request_id for u in updates], f"the stream stalled at step {steps}"
        if "long" in [u.request_id for u in updates]:
            break
    assert steps >= 600 // 32
    assert decode_rows == [1] * steps


# ---- admission and preemption -----------------------------------------------------------------------


def test_one_large_request_does_not_cap_the_rows_of_everyone_else(tiny_engine_factory):
    # Prompt 300 + max_tokens 600 fits the 1024-token budget. Charged for a padded rectangle of
    # its whole need, it would leave room for no other row; charged for what it holds, it leaves
    # room for five more rows of 128 at once.
    engine = tiny_engine_factory(max_batch=8, max_wait_ms=0, kv_budget_tokens=1024)
    engine.add_request(ids_req("large", words(300, 8), n=600))
    for i in range(5):
        engine.add_request(ids_req(f"small{i}", words(8, 30 + i), n=20))
    engine.step()
    assert len(engine.scheduler.running) == 6 and not engine.scheduler.waiting


def test_a_request_that_does_not_fit_yet_is_passed_over_then_served(tiny_model_dir):
    clock = HandClock()
    engine = Engine.load(EngineConfig(model=str(tiny_model_dir), max_batch=8, max_wait_ms=0, kv_budget_tokens=1024,
                                      admission_patience_s=0.3, torch_threads=1, dtype="float32"), clock=clock)
    for i in range(4):  # 4 x 128 held
        engine.add_request(ids_req(f"early{i}", words(8, 40 + i), n=100))
    engine.step()
    engine.add_request(ids_req("large", words(600, 9), n=8))  # needs 640: does not fit now
    engine.add_request(ids_req("small", words(8, 50), n=8))
    engine.step()
    running = {s.request_id for s in engine.scheduler.running}
    assert "small" in running and "large" not in running  # not held hostage by "large"
    # Once "large" has waited its patience, nobody passes it, and it gets the memory that frees up.
    clock.advance(0.35)
    engine.add_request(ids_req("late", words(8, 51), n=8))

    def running() -> set[str]:
        return {s.request_id for s in engine.scheduler.running}

    for _ in range(1000):
        engine.step()
        if "large" in running():
            break
        assert "late" not in running(), "a request passed one that had waited its patience"
    ended = set()
    while engine.has_work():
        ended |= {u.request_id for u in engine.step() if u.finish_reason}
    assert {"large", "late"} <= ended


def test_sequences_that_outgrow_the_memory_are_preempted_and_finish_as_if_never_stopped(tiny_engine_factory):
    requests = [ids_req(f"r{i}", words(10, 60 + i), n=300) for i in range(6)]
    roomy = tiny_engine_factory(max_wait_ms=0, kv_budget_tokens=16_384)
    expected = run(roomy, requests)
    assert roomy.scheduler.preemptions == 0
    # Six sequences of up to 310 positions (each 384 at the end) in 1,024 tokens of memory: they
    # all start (128 each) and must be preempted and recomputed as they grow.
    tight = tiny_engine_factory(max_wait_ms=0, kv_budget_tokens=1024)
    assert run(tight, requests) == expected
    assert tight.scheduler.preemptions > 0
    assert tight.kv.used_tokens == tight.prefix.cached_tokens  # nothing held by a sequence at the end
