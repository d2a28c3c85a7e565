"""`brigade bench serve` and `brigade capacity`.

First as pure functions: the SLO parser, the percentile maths, goodput, the arrival process, the
workload and the capacity arithmetic on fixed inputs. Then real short runs of the command, as a
subprocess, against a real stack: a real redis-server, a real `brigade gateway` and one real
`brigade worker` with the default model, through both backends.
"""
from __future__ import annotations

import json
import math
import os
import statistics
import subprocess
import sys
from pathlib import Path

import pytest

from ops.commands.capacity import NoRunMeetsObjectives, SweepPoint, plan_capacity, sweep_point, workers_needed
from ops.bench.serve_stats import (InvalidObjective, RequestResult, distribution, judge, parse_slo, percentile,
                             run_metrics)
from ops.bench.serve_workload import (InvalidDataset, Prompt, arrival_gaps, arrival_times, load_dataset, plan_requests,
                                reword)
from ops.bench.serve_config import target_urls
from ops.core.settings import Settings
from tests.services import Stack, free_port

ROOT = Path(__file__).resolve().parent.parent


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


# ---- the command, in-process, where no stack is needed -------------------------------------------


def test_a_bad_objective_exits_2_before_sending_anything(capsys):
    from ops.cli import main

    assert main(["bench", "serve", "--url", f"http://127.0.0.1:{free_port()}", "--slo", "ttft_p95<=2"]) == 2
    assert "unit" in capsys.readouterr().err


def test_a_target_that_does_not_answer_exits_2_with_a_message(capsys):
    from ops.cli import main

    port = free_port()
    for backend in ("ws", "openai"):
        assert main(["bench", "serve", "--backend", backend, "--url", f"http://127.0.0.1:{port}",
                     "--num-requests", "1"]) == 2
        assert "does not answer" in capsys.readouterr().err


def test_an_endless_run_is_refused(capsys):
    from ops.cli import main

    assert main(["bench", "serve", "--duration", "5"]) == 2
    assert "--rate or --max-concurrency" in capsys.readouterr().err


# ---- real runs against a real stack ---------------------------------------------------------------


stack_redis: dict[str, str] = {}  # the stack's gateway URL -> its Redis


@pytest.fixture(scope="module")
def stack(redis_server, tiny_model_dir, tmp_path_factory):
    # What the benchmark measures and reports is mechanics: the tiny model answers.
    with Stack(redis_server, tmp_path_factory.mktemp("bench-serve-logs"), BRIGADE_WORKER_CONCURRENCY="16",
               BRIGADE_MAX_WAIT_MS="20", BRIGADE_MODEL=str(tiny_model_dir), BRIGADE_TORCH_THREADS="1") as s:
        s.start_gateway()
        s.start_worker("w1@bench-serve")
        s.wait_ready()
        stack_redis[s.http] = redis_server.url
        yield s.http


def bench_serve(url: str, *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ops.cli", "bench", "serve", "--url", url, *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=timeout)


REPORT_FIELDS = {"target", "config", "duration_s", "requests", "request_throughput", "output_token_throughput",
                 "total_output_tokens", "concurrency_mean", "ttft_s", "tpot_s", "itl_s", "e2e_s", "errors",
                 "error_rate", "cache", "slo", "per_request"}


@pytest.fixture(scope="module")
def short_runs(stack, tmp_path_factory):
    """One short open-loop run per backend: 8 requests at 4/s, 8 tokens each, uncached; the
    WebSocket run also counts the Redis commands."""
    out = tmp_path_factory.mktemp("bench-serve")
    runs = {}
    for seed, backend in enumerate(("ws", "openai")):
        json_path, png_path = out / f"{backend}.json", out / f"{backend}.png"
        redis_flags = ["--redis-url", stack_redis[stack]] if backend == "ws" else []
        done = bench_serve(stack, "--backend", backend, "--num-requests", "8", "--max-tokens", "8", "--rate", "4",
                           "--seed", str(seed), "--cache", "off", "--slo", "ttft_p95<=60s",
                           "--json", str(json_path), "--plot", str(png_path), *redis_flags)
        runs[backend] = (done, json_path, png_path)
    return runs


@pytest.mark.parametrize("backend", ["ws", "openai"])
def test_a_short_run_reports_every_field_and_passes_a_loose_slo(short_runs, backend):
    done, json_path, _ = short_runs[backend]
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(json_path.read_text())
    assert json.loads(done.stdout) == report
    assert set(report) == REPORT_FIELDS | ({"redis"} if backend == "ws" else set())
    assert report["config"]["backend"] == backend and report["config"]["rate"] == 4.0
    assert report["config"]["target_workers"] == 1
    assert report["requests"]["sent"] == report["requests"]["completed"] == 8
    assert report["errors"] == {} and report["error_rate"] == 0
    assert report["cache"]["hits"] == 0 and report["cache"]["hit_ratio"] == 0
    assert 8 <= report["total_output_tokens"] <= 64
    assert all(row["output_tokens"] == 8 and row["finish_reason"] == "length" for row in report["per_request"])
    for metric in ("ttft_s", "tpot_s", "itl_s", "e2e_s"):
        d = report[metric]
        assert set(d) == {"mean", "p50", "p90", "p95", "p99", "count"}
        assert 0 < d["p50"] <= d["p90"] <= d["p95"] <= d["p99"], (metric, d)
    assert report["ttft_s"]["p99"] < report["e2e_s"]["p99"]
    assert report["request_throughput"] == pytest.approx(8 / report["duration_s"], rel=1e-3)
    assert report["output_token_throughput"] == pytest.approx(report["total_output_tokens"] / report["duration_s"],
                                                              rel=1e-3)
    slo = report["slo"]
    assert slo["passed"] is True and slo["good_requests"] == 8
    assert slo["objectives"][0]["measured"] == report["ttft_s"]["p95"]
    assert "PASS ttft_p95<=60s" in done.stderr
    if backend == "ws":
        # Every token was published live and logged for replay: at least one of each per token.
        r = report["redis"]
        tokens = report["total_output_tokens"]
        assert r["by_command"]["publish"] >= tokens and r["by_command"]["xadd"] >= tokens, r
        assert r["per_output_token"] == pytest.approx(r["commands"] / tokens, rel=1e-2)
        assert r["per_request"] == pytest.approx(r["commands"] / 8, rel=1e-2)
        assert "redis:" in done.stderr


@pytest.mark.parametrize("backend", ["ws", "openai"])
def test_the_plot_is_a_real_png(short_runs, backend):
    _, _, png_path = short_runs[backend]
    data = png_path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    assert len(data) > 20_000


def test_capacity_reads_the_runs_and_shows_its_arithmetic(short_runs):
    paths = [str(short_runs[b][1]) for b in ("ws", "openai")]
    done = subprocess.run([sys.executable, "-m", "ops.cli", "capacity", "--qps", "10", "--slo", "ttft_p95<=60s",
                           "--from", *paths, "--json", "-"], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    plan = json.loads(done.stdout)
    assert plan["chosen"] in paths and plan["workers"] == plan["workers_by_rate"] >= 1
    assert plan["workers"] == math.ceil(10 * plan["e2e_mean_s"] / plan["concurrency_per_worker"] - 1e-9)
    strict = subprocess.run([sys.executable, "-m", "ops.cli", "capacity", "--qps", "10", "--slo", "ttft_p95<=1ms",
                             "--from", *paths], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert strict.returncode == 1 and "no run meets every objective" in strict.stderr


def test_an_unmet_slo_fails_the_run_with_exit_1(stack):
    done = bench_serve(stack, "--num-requests", "3", "--max-tokens", "8", "--rate", "4", "--cache", "off",
                       "--slo", "ttft_p95<=1ms,error_rate<=0.01")
    assert done.returncode == 1, done.stderr[-3000:]
    report = json.loads(done.stdout)
    verdicts = {v["objective"]: v["passed"] for v in report["slo"]["objectives"]}
    assert verdicts == {"ttft_p95<=1ms": False, "error_rate<=0.01": True}
    assert report["slo"]["good_requests"] == 0 and report["slo"]["goodput"] == 0
    assert "FAIL ttft_p95<=1ms" in done.stderr


@pytest.mark.parametrize("backend, seed", [("ws", 11), ("openai", 14)])
def test_repeated_questions_are_answered_from_the_cache(stack, backend, seed):
    prompts = load_dataset()
    plan = _take(plan_requests(prompts, seed, repeat_ratio=0.5, max_tokens=8), 8)
    # Asked one at a time, a word-for-word repeat of a question answered at least one request
    # earlier must find it stored (the answer is stored just after its done event is sent).
    settled = [r.index for r in plan if r.kind == "exact" and r.index - r.repeats >= 2]
    assert settled, "the seed must plan an exact repeat of an earlier, finished request"
    done = bench_serve(stack, "--backend", backend, "--num-requests", "8", "--max-tokens", "8",
                       "--max-concurrency", "1", "--repeat-ratio", "0.5", "--seed", str(seed))
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout)
    assert report["config"]["arrivals"] == "closed loop"
    assert [row["kind"] for row in report["per_request"]] == [r.kind for r in plan]
    assert report["cache"]["hits"] > 0 and report["cache"]["hit_ratio"] > 0
    cached = {row["index"]: row["cached"] for row in report["per_request"]}
    assert all(cached[i] == "exact" for i in settled), (settled, cached)
    assert report["errors"] == {}


# ---- bench scale ----------------------------------------------------------------------------------


def test_scale_refuses_a_bad_fleet_size_before_starting_anything():
    done = subprocess.run([sys.executable, "-m", "ops.cli", "bench", "scale", "--workers", "1,zero"], cwd=ROOT,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "--workers takes fleet sizes" in done.stderr, done.stderr


def test_scale_starts_its_own_fleet_of_two_workers_and_reports_its_throughput(tmp_path, tiny_model_dir):
    """`brigade up --workers 2` under bench scale: both workers start and the fleet serves every
    request, the report has the asked shape, and the fleet is stopped in order (the tiny model)."""
    out = tmp_path / "scale.json"
    env = dict(os.environ, BRIGADE_MODEL=str(tiny_model_dir), BRIGADE_TORCH_THREADS="1")
    done = subprocess.run([sys.executable, "-m", "ops.cli", "bench", "scale", "--workers", "2", "--num-requests",
                           "6", "--max-tokens", "4", "--json", str(out)], cwd=ROOT, capture_output=True, text=True,
                          timeout=400, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(out.read_text())
    (row,) = report["results"]
    assert row["workers"] == 2 and row["errors"] == 0 and row["ratio"] == 1.0
    assert row["output_tokens"] == 24 and row["tok_s"] == pytest.approx(24 / row["duration_s"], rel=0.05)
    log = (Path(report["logs"]) / "fleet-2.log").read_text()
    assert log.count("event=worker_ready") == 2, log[-3000:]
    assert log.count("event=request_done") == 6, log[-3000:]
    assert "stopping gateway, then worker, then reaper, then redis" in log
