"""`brigade bench serve` and `brigade capacity` as pure functions, on fixed inputs: the SLO parser,
the percentile maths, the run's measures and goodput, the arrival process, the workload (the
shipped dataset, repeats and rewordings), the target URL and the capacity arithmetic. The command
itself, in-process and against a real stack, is tests/test_bench_serve.py."""
from __future__ import annotations

import json
import math
import statistics

import pytest

from ops.bench.serve_config import target_urls
from ops.bench.serve_stats import (
    InvalidObjective,
    RequestResult,
    distribution,
    judge,
    parse_slo,
    run_metrics,
)
from ops.core.percentiles import percentile, statistic
from ops.bench.serve_workload import (
    InvalidDataset,
    Prompt,
    arrival_gaps,
    arrival_times,
    load_dataset,
    plan_requests,
    reword,
)
from ops.commands.capacity import NoRunMeetsObjectives, SweepPoint, plan_capacity, sweep_point, workers_needed
from ops.core.settings import Settings

# ---- objectives ---------------------------------------------------------------------------------


def test_slo_parses_latencies_in_seconds_and_milliseconds_and_the_error_rate():
    objectives = parse_slo("ttft_p95<=2s, tpot_p50<=200ms,itl_p99<0.5s,e2e_mean<=10s,error_rate<=0.01")
    assert [(o.metric, o.stat, o.op, o.threshold) for o in objectives] == [
        ("ttft", "p95", "<=", 2.0), ("tpot", "p50", "<=", 0.2), ("itl", "p99", "<", 0.5),
        ("e2e", "mean", "<=", 10.0), ("error_rate", "", "<=", 0.01)]
    assert objectives[1].text == "tpot_p50<=200ms"
    assert parse_slo("error_rate<1%")[0].threshold == pytest.approx(0.01)
    assert parse_slo("ttft_p99.9<=1.5s")[0].stat == "p99.9"


@pytest.mark.parametrize("text, says", [
    ("ttft_p95<=2", "unit"),
    ("latency_p95<=2s", "not an objective"),
    ("ttft_p0<=1s", "percentile"),
    ("ttft_p101<=1s", "percentile"),
    ("ttft_p95>=2s", "not an objective"),
    ("error_rate<=2", "fraction"),
    ("ttft_p95<=2s,", "empty"),
])
def test_a_malformed_objective_is_refused_with_a_reason(text, says):
    with pytest.raises(InvalidObjective, match=says):
        parse_slo(text)


def test_an_objective_holds_only_within_its_threshold():
    at_most, below = parse_slo("ttft_p95<=2s,ttft_p95<2s")
    assert at_most.holds(2.0) and not below.holds(2.0)
    assert at_most.holds(1.9) and not at_most.holds(2.01)
    assert not at_most.holds(None)


# ---- percentiles and the run's measures ---------------------------------------------------------


def test_percentiles_interpolate_between_the_closest_ranks():
    values = [4.0, 1.0, 3.0, 2.0]
    # rank = q/100 * (n - 1) on the sorted values [1, 2, 3, 4]
    assert percentile(values, 50) == pytest.approx(2.5)
    assert percentile(values, 90) == pytest.approx(3.7)
    assert percentile(values, 99) == pytest.approx(3.97)
    assert percentile(values, 0) == 1.0 and percentile(values, 100) == 4.0
    assert percentile([7.0], 95) == 7.0
    assert percentile([], 50) is None
    with pytest.raises(ValueError):
        percentile(values, 101)


def test_one_statistic_for_canaries_and_benches():
    # The canary's verdicts and the bench's tables read a latency the same way (ops/core/percentiles.py).
    values = [4.0, 1.0, 3.0, 2.0]
    assert statistic(values, "mean") == 2.5 and statistic(values, "p90") == pytest.approx(3.7)
    assert statistic([], "p50") is None and statistic([], "mean") is None
    with pytest.raises(ValueError):
        statistic(values, "median")
    d = distribution(list(range(1, 101)))
    assert d == {"mean": 50.5, "p50": 50.5, "p90": 90.1, "p95": 95.05, "p99": 99.01, "count": 100}


def _result(i, ttft, e2e, tokens, itl=None, cached=None, error=None, start=0.0):
    return RequestResult(i, "fresh", start, ttft, e2e, list(itl or []), tokens, cached, "length", error)


def test_tpot_is_the_decode_time_per_token_after_the_first_and_skips_cached_answers():
    assert _result(0, 0.5, 2.5, 5).tpot_s == pytest.approx(0.5)  # (2.5 - 0.5) / (5 - 1)
    assert _result(1, 0.01, 0.02, 8, cached="exact").tpot_s is None
    assert _result(2, 0.3, 0.3, 1).tpot_s is None
    assert _result(3, None, 1.0, 0, error="overloaded").tpot_s is None


def test_run_measures_count_throughput_errors_and_cache_hits():
    results = [
        _result(0, 0.5, 2.5, 5, itl=[0.5, 0.5, 0.5, 0.5], start=0.0),
        _result(1, 1.5, 3.5, 3, itl=[1.0, 1.0], start=1.0),
        _result(2, 0.01, 0.01, 4, itl=[], cached="exact", start=2.0),
        _result(3, None, 0.5, 0, error="overloaded", start=3.0),
    ]
    m = run_metrics(results, duration_s=4.0)
    assert m["requests"] == {"sent": 4, "completed": 3, "failed": 1, "fresh": 4, "exact_repeats": 0,
                             "reworded_repeats": 0}
    assert m["request_throughput"] == 0.75 and m["output_token_throughput"] == 3.0 and m["total_output_tokens"] == 12
    assert m["errors"] == {"overloaded": 1} and m["error_rate"] == 0.25
    assert m["cache"] == {"hits": 1, "exact": 1, "semantic": 0, "hit_ratio": round(1 / 3, 4)}
    assert m["ttft_s"]["count"] == 3 and m["ttft_s"]["p50"] == 0.5
    assert m["tpot_s"]["count"] == 2 and m["tpot_s"]["mean"] == pytest.approx(0.75)  # 0.5 and 1.0; not the cached
    assert m["itl_s"]["count"] == 6 and m["itl_s"]["mean"] == pytest.approx(4 / 6)
    assert m["concurrency_mean"] == pytest.approx((2.5 + 3.5 + 0.01 + 0.5) / 4, abs=1e-4)


def test_goodput_counts_the_requests_that_met_every_latency_objective():
    results = [
        _result(0, 0.5, 2.5, 5),   # good
        _result(1, 1.5, 3.5, 3),   # ttft too slow
        _result(2, 0.4, 8.4, 5),   # tpot 2.0: too slow
        _result(3, 0.01, 0.01, 4, cached="exact"),  # good: no tpot to miss
        _result(4, None, 0.5, 0, error="overloaded"),  # failed: never good
    ]
    verdict = judge(parse_slo("ttft_p50<=1s,tpot_p50<=1s,error_rate<=0.1"), results, duration_s=4.0)
    assert verdict["good_requests"] == 2 and verdict["goodput"] == 0.5
    by_name = {v["objective"]: v for v in verdict["objectives"]}
    assert by_name["ttft_p50<=1s"]["measured"] == 0.45 and by_name["ttft_p50<=1s"]["passed"]
    assert by_name["tpot_p50<=1s"]["measured"] == pytest.approx(1.0) and by_name["tpot_p50<=1s"]["passed"]
    assert by_name["error_rate<=0.1"]["measured"] == 0.2 and not by_name["error_rate<=0.1"]["passed"]
    assert verdict["passed"] is False
    assert judge(parse_slo("ttft_p50<=1s"), results, 4.0)["passed"] is True


def test_an_objective_with_nothing_measured_fails():
    verdict = judge(parse_slo("ttft_p95<=60s"), [_result(0, None, 0.1, 0, error="no_workers")], 1.0)
    assert verdict["objectives"][0]["measured"] is None and verdict["passed"] is False


def test_request_results_survive_the_json_report():
    r = _result(3, 0.25, 1.25, 5, itl=[0.25] * 4, cached=None, start=0.5)
    again = RequestResult.from_json(json.loads(json.dumps(r.to_json())))
    assert again == r and again.tpot_s == r.tpot_s


# ---- arrivals and workload ----------------------------------------------------------------------


def test_a_seeded_poisson_schedule_has_the_asked_mean_rate_and_exponential_gaps():
    times = arrival_times(rate=5.0, burstiness=1.0, seed=7, count=5001)
    gaps = [b - a for a, b in zip(times, times[1:])]
    assert times[0] == 0.0
    assert 5000 / times[-1] == pytest.approx(5.0, rel=0.05)
    assert statistics.pstdev(gaps) / statistics.mean(gaps) == pytest.approx(1.0, rel=0.07)  # exponential: CV 1
    assert arrival_times(5.0, 1.0, 7, 50) == times[:50]
    assert arrival_times(5.0, 1.0, 8, 50) != times[:50]


def test_burstiness_keeps_the_mean_rate_and_changes_the_spread_of_gaps():
    steady = arrival_times(rate=2.0, burstiness=4.0, seed=1, count=4001)
    bursty = arrival_times(rate=2.0, burstiness=0.25, seed=1, count=4001)
    for times in (steady, bursty):
        assert 4000 / times[-1] == pytest.approx(2.0, rel=0.1)
    cv = lambda t: statistics.pstdev([b - a for a, b in zip(t, t[1:])]) / statistics.mean([b - a for a, b in zip(t, t[1:])])  # noqa: E731
    assert cv(steady) == pytest.approx(0.5, rel=0.1)  # gamma CV = 1/sqrt(shape)
    assert cv(bursty) == pytest.approx(2.0, rel=0.15)


def test_an_infinite_rate_sends_everything_at_once():
    gaps = arrival_gaps(math.inf, 1.0, seed=0)
    assert [next(gaps) for _ in range(5)] == [0.0] * 5


def test_the_shipped_dataset_is_two_hundred_varied_chat_requests():
    prompts = load_dataset()
    assert 180 <= len(prompts) <= 220
    assert len({json.dumps(p.messages) for p in prompts}) == len(prompts)
    assert len({p.max_tokens for p in prompts}) >= 8 and min(p.max_tokens for p in prompts) <= 32
    assert max(p.max_tokens for p in prompts) >= 256
    assert any(p.messages[0]["role"] == "system" for p in prompts)
    assert any(len(p.messages) >= 3 for p in prompts)
    lengths = sorted(len(p.messages[-1]["content"]) for p in prompts)
    assert lengths[0] < 40 and lengths[-1] > 250


def test_a_bad_dataset_line_is_named(tmp_path):
    path = tmp_path / "questions.jsonl"
    path.write_text('{"question": "Hi?"}\n{"messages": "Hi"}\n')
    with pytest.raises(InvalidDataset, match="questions.jsonl:2"):
        load_dataset(path)
    path.write_text('{"question": "Hi?", "max_tokens": 16}\n\n{"messages": [{"role": "user", "content": "Yo"}]}\n')
    assert load_dataset(path) == [Prompt(({"role": "user", "content": "Hi?"},), 16),
                                  Prompt(({"role": "user", "content": "Yo"},), None)]


def _take(iterator, n):
    return [next(iterator) for _ in range(n)]


def test_without_repeats_the_dataset_is_asked_in_a_seeded_order_without_duplicates():
    prompts = load_dataset()
    plan = _take(plan_requests(prompts, seed=1), len(prompts))
    assert {r.kind for r in plan} == {"fresh"}
    assert len({json.dumps(r.messages) for r in plan}) == len(prompts)
    assert plan == _take(plan_requests(prompts, seed=1), len(prompts))
    assert plan[:10] != _take(plan_requests(prompts, seed=2), 10)
    assert {r.max_tokens for r in _take(plan_requests(prompts, seed=1, max_tokens=8), 20)} == {8}


def test_repeats_are_earlier_questions_word_for_word_or_reworded():
    prompts = load_dataset()
    plan = _take(plan_requests(prompts, seed=4, repeat_ratio=0.5, max_tokens=16), 400)
    by_index = {r.index: r for r in plan}
    exact = [r for r in plan if r.kind == "exact"]
    reworded = [r for r in plan if r.kind == "reworded"]
    assert 0.4 < (len(exact) + len(reworded)) / len(plan) < 0.6
    assert len(exact) > 50 and len(reworded) > 50
    for r in exact:
        original = by_index[r.repeats]
        assert original.kind == "fresh" and original.index < r.index
        assert r.messages == original.messages and r.max_tokens == original.max_tokens == 16
    for r in reworded:
        original = by_index[r.repeats]
        assert r.messages[:-1] == original.messages[:-1]  # every shipped conversation ends with the user
        assert r.messages[-1]["content"] != original.messages[-1]["content"]
        assert r.max_tokens == original.max_tokens


def test_a_rewording_changes_only_the_last_user_message():
    import random

    messages = ({"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is the capital of Spain?"})
    for seed in range(10):
        changed = reword(messages, random.Random(seed))
        assert changed[0] == messages[0] and changed[1]["role"] == "user"
        assert changed[1]["content"] != messages[1]["content"]
        assert "capital of spain" in changed[1]["content"].lower()


def test_the_target_defaults_to_the_settings_gateway_and_accepts_a_base_or_a_ws_url():
    settings = Settings(gateway_host="127.0.0.1", gateway_port=9001)
    assert target_urls("ws", None, settings) == ("ws://127.0.0.1:9001/v1/ws", "http://127.0.0.1:9001")
    assert target_urls("openai", None, settings) == ("http://127.0.0.1:9001/v1/chat/completions",
                                                     "http://127.0.0.1:9001")
    assert target_urls("openai", "http://gpu-box:8000/v1/", settings) == ("http://gpu-box:8000/v1/chat/completions",
                                                                          "http://gpu-box:8000")
    assert target_urls("ws", "ws://h:1/v1/ws", settings) == ("ws://h:1/v1/ws", "http://h:1")


# ---- capacity arithmetic ------------------------------------------------------------------------


def _point(source, rate, good_rate, e2e, passed, workers=1):
    return SweepPoint(source, rate, good_rate, e2e, good_rate * e2e, passed, () if passed else ("FAIL x",), workers)


def test_capacity_takes_the_fastest_passing_run_and_applies_littles_law():
    points = [_point("r1.json", 1.0, 1.0, 2.0, True), _point("r2.json", 2.0, 1.6, 2.5, True),
              _point("r3.json", 4.0, 2.0, 9.0, False)]
    plan = plan_capacity(10.0, points)
    assert plan["chosen"] == "r2.json"
    assert plan["e2e_mean_s"] == 2.5 and plan["concurrency_per_worker"] == pytest.approx(4.0)
    assert plan["in_flight_needed"] == 25.0
    assert plan["workers"] == 7 == plan["workers_by_rate"]  # ceil(25 / 4) = ceil(6.25); ceil(10 / 1.6)
    assert any("ceil(25 / 4) = ceil(6.25) = 7 workers" in step for step in plan["steps"]), plan["steps"]
    assert plan_capacity(100.0, points)["workers"] == 63  # ceil(62.5)


def test_capacity_needs_no_extra_worker_for_float_noise():
    assert workers_needed(qps=3.0, e2e_mean_s=0.1 * 3, concurrency_per_worker=0.3) == 3
    assert workers_needed(qps=10.0, e2e_mean_s=2.0, concurrency_per_worker=4.0) == 5
    assert workers_needed(qps=10.0, e2e_mean_s=2.0, concurrency_per_worker=3.9) == 6


def test_capacity_without_a_passing_run_says_so():
    with pytest.raises(NoRunMeetsObjectives):
        plan_capacity(10.0, [_point("r3.json", 4.0, 2.0, 9.0, False)])


def test_a_run_is_judged_again_by_the_capacity_objectives_and_divided_by_its_workers():
    rows = [_result(i, 0.2 + 0.1 * i, 1.0 + 0.1 * i, 8, itl=[0.1] * 7, start=i * 0.5).to_json() for i in range(10)]
    report = {"target": "serve", "duration_s": 5.0, "config": {"rate": 2.0, "target_workers": 2}, "per_request": rows}
    strict = sweep_point(report, parse_slo("ttft_p95<=0.5s"), "run.json")
    loose = sweep_point(report, parse_slo("ttft_p95<=2s"), "run.json")
    assert not strict.passed and strict.failed and "ttft_p95<=0.5s" in strict.failed[0]
    assert loose.passed and loose.workers == 2
    assert loose.good_rate == pytest.approx(1.0)  # 10 answers / 5 s / 2 workers
    assert loose.e2e_mean_s == pytest.approx(1.45) and loose.concurrency == pytest.approx(1.45)
    with pytest.raises(ValueError):
        sweep_point({"target": "doors"}, [], "doors.json")
