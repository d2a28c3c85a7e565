"""`brigade bench serve` and `brigade capacity` as commands: in-process where no stack is needed
(refusals before anything is sent), then real short runs of the command, as a subprocess, against
a real stack: a real redis-server, a real `brigade gateway` and one real `brigade worker` (the tiny
model), through both backends; and `brigade bench scale` with its own fleet. The pure functions
(SLO parser, percentiles, goodput, arrivals, workload, capacity arithmetic) are
tests/test_bench_serve_stats.py.
"""
from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from ops.bench.serve_workload import load_dataset, plan_requests
from tests.services import Stack, free_port
from tests.test_bench_serve_stats import _take

ROOT = Path(__file__).resolve().parent.parent


# ---- the command, in-process, where no stack is needed -------------------------------------------


def test_a_bad_objective_exits_2_before_sending_anything(capsys):
    from ops.commands.cli import main

    assert main(["bench", "serve", "--url", f"http://127.0.0.1:{free_port()}", "--slo", "ttft_p95<=2"]) == 2
    assert "unit" in capsys.readouterr().err


def test_a_target_that_does_not_answer_exits_2_with_a_message(capsys):
    from ops.commands.cli import main

    port = free_port()
    for backend in ("ws", "openai"):
        assert main(["bench", "serve", "--backend", backend, "--url", f"http://127.0.0.1:{port}",
                     "--num-requests", "1"]) == 2
        assert "does not answer" in capsys.readouterr().err


def test_an_endless_run_is_refused(capsys):
    from ops.commands.cli import main

    assert main(["bench", "serve", "--duration", "5"]) == 2
    assert "--rate or --max-concurrency" in capsys.readouterr().err


# ---- real runs against a real stack ---------------------------------------------------------------


stack_redis: dict[str, str] = {}  # the stack's gateway URL -> its Redis
lenient: dict[str, str] = {}  # the stack's gateway URL -> a second gateway whose pair model never objects


@pytest.fixture(scope="module")
def stack(redis_server, tiny_model_dir, tmp_path_factory):
    # What the benchmark measures and reports is mechanics: the tiny model answers.
    with Stack(redis_server, tmp_path_factory.mktemp("bench-serve-logs"), BRIGADE_WORKER_CONCURRENCY="16",
               BRIGADE_MAX_WAIT_MS="20", BRIGADE_MODEL=str(tiny_model_dir), BRIGADE_TORCH_THREADS="1") as s:
        s.start_gateway()
        # Serves every proposal no guard vetoes: the replay's look-alikes must be served to be judged.
        loose = s.start_gateway("lenient", BRIGADE_CACHE_OBJECTION="0", BRIGADE_CACHE_AGREE="0")
        s.start_worker("w1@bench-serve")
        s.wait_ready()
        stack_redis[s.http] = redis_server.url
        lenient[s.http] = f"http://127.0.0.1:{loose.port}"
        yield s.http


def bench_serve(url: str, *args: str, timeout: float = 300, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ops.commands.cli", "bench", "serve", "--url", url, *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=timeout, env=env)


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
    done = subprocess.run([sys.executable, "-m", "ops.commands.cli", "capacity", "--qps", "10", "--slo", "ttft_p95<=60s",
                           "--from", *paths, "--json", "-"], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    plan = json.loads(done.stdout)
    assert plan["chosen"] in paths and plan["workers"] == plan["workers_by_rate"] >= 1
    assert plan["workers"] == math.ceil(10 * plan["e2e_mean_s"] / plan["concurrency_per_worker"] - 1e-9)
    strict = subprocess.run([sys.executable, "-m", "ops.commands.cli", "capacity", "--qps", "10", "--slo", "ttft_p95<=1ms",
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


def test_chat_turns_send_each_turn_with_the_answers_before_it_and_read_the_workers_prefix_cache(stack):
    """Two conversations of three turns, each with its own system prompt of about 100 tokens, both at
    once, over the WebSocket, uncached. The worker's own counts say what it was sent: each turn's
    prompt holds the previous one's and its answer, and the prefix cache (its /metrics, found from
    its heartbeat in the stack's Redis, BRIGADE_REDIS_URL) looked up every prompt token of the run
    and found at least each previous turn's whole blocks (BLOCK_TOKENS) again."""
    from engine.prefix_index import BLOCK_TOKENS

    done = bench_serve(stack, "--workload", "chat-turns", "--conversations", "2", "--turns", "3", "--system-tokens",
                       "100", "--max-concurrency", "2", "--max-tokens", "8", "--cache", "off",
                       env=dict(os.environ, BRIGADE_REDIS_URL=stack_redis[stack]))
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout)
    rows = report["per_request"]
    assert [(r["conversation"], r["turn"], r["messages"]) for r in rows] == \
        [(c, k, 2 * k) for c in (0, 1) for k in (1, 2, 3)]
    assert report["errors"] == {} and report["conversations"] == {"planned": 2, "finished": 2}
    for earlier, later in zip(rows, rows[1:]):
        if later["conversation"] == earlier["conversation"]:
            assert later["prompt_tokens"] > earlier["prompt_tokens"] + earlier["output_tokens"], (earlier, later)
    by_turn = report["ttft_s_by_turn"]
    assert set(by_turn) == {"1", "2", "3"} and all(d["count"] == 2 and 0 < d["p50"] <= d["p95"]
                                                   for d in by_turn.values()), by_turn
    prefix = report["prefix_cache"]
    assert prefix["workers"] == 1 and prefix["queries"] == sum(r["prompt_tokens"] for r in rows), (prefix, rows)
    found_again = sum((earlier["prompt_tokens"] - 1) // BLOCK_TOKENS * BLOCK_TOKENS
                      for earlier, later in zip(rows, rows[1:]) if later["conversation"] == earlier["conversation"])
    assert found_again <= prefix["hits"] < prefix["queries"], (found_again, prefix)
    assert prefix["hit_ratio"] == round(prefix["hits"] / prefix["queries"], 4) and 0 < prefix["hit_ratio"] < 1
    assert "ttft by turn" in done.stderr and "prefix cache:" in done.stderr


# ---- bench scale ----------------------------------------------------------------------------------


def test_scale_refuses_a_bad_fleet_size_before_starting_anything():
    done = subprocess.run([sys.executable, "-m", "ops.commands.cli", "bench", "scale", "--workers", "1,zero"], cwd=ROOT,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "--workers takes fleet sizes" in done.stderr, done.stderr


def test_scale_starts_its_own_fleet_of_two_workers_and_reports_its_throughput(tmp_path, tiny_model_dir):
    """`brigade up --workers 2` under bench scale: both workers start and the fleet serves every
    request, the report has the asked shape, and the fleet is stopped in order (the tiny model)."""
    out = tmp_path / "scale.json"
    env = dict(os.environ, BRIGADE_MODEL=str(tiny_model_dir), BRIGADE_TORCH_THREADS="1")
    done = subprocess.run([sys.executable, "-m", "ops.commands.cli", "bench", "scale", "--workers", "2", "--num-requests",
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



def test_scale_runs_the_chat_turns_under_a_routing_mode_and_reads_its_own_fleets_prefix_cache(tmp_path,
                                                                                              tiny_model_dir):
    """--routing shared with the chat-turns workload: one fleet of one worker started with
    BRIGADE_ROUTING=shared (its log named for it), one row with the routing, TTFT overall and by turn,
    and the prefix-cache tokens read from that fleet's own worker (its Redis, not the settings')."""
    out = tmp_path / "scale.json"
    env = dict(os.environ, BRIGADE_MODEL=str(tiny_model_dir), BRIGADE_TORCH_THREADS="1")
    done = subprocess.run([sys.executable, "-m", "ops.commands.cli", "bench", "scale", "--workers", "1", "--routing", "shared",
                           "--workload", "chat-turns", "--conversations", "2", "--turns", "2", "--system-tokens", "80",
                           "--max-tokens", "4", "--json", str(out)], cwd=ROOT, capture_output=True, text=True,
                          timeout=400, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(out.read_text())
    (row,) = report["results"]
    assert row["workers"] == 1 and row["routing"] == "shared" and row["errors"] == 0 and row["ratio"] == 1.0
    assert row["output_tokens"] == 16 and set(row["ttft_s_by_turn"]) == {"1", "2"}
    assert all(0 < t["p50"] <= t["p95"] for t in row["ttft_s_by_turn"].values()) and row["ttft_p95_s"] > 0
    prefix = row["prefix_cache"]
    assert prefix["workers"] == 1 and 0 < prefix["hits"] < prefix["queries"], prefix
    assert row["prefix_hit_ratio"] == prefix["hit_ratio"] == round(prefix["hits"] / prefix["queries"], 4)
    assert report["load"]["workload"]["conversations"] == 2
    log = (Path(report["logs"]) / "fleet-1-shared.log").read_text()
    assert log.count("event=request_done") == 4, log[-3000:]
    assert "shared routing" in done.stderr


# ---- bench cache-replay ---------------------------------------------------------------------------

# Six sources, each with a rewording and a look-alike that means something else. Four look-alikes
# passed every guard with a cosine of 0.83-0.89 to their source when written, so that a loose
# threshold serves them.
REPLAY_PAIRS = [
    ("How do I make my dog stop barking at night?", "How can I get my dog to stop barking at night?",
     "How do I make my dog start barking at night?"),
    ("What are the health benefits of drinking green tea?", "What health benefits does drinking green tea have?",
     "What are the health benefits of drinking black tea?"),
    ("How do I remove a stain from a white shirt?", "How can I get a stain out of a white shirt?",
     "How do I remove a stain from a white carpet?"),
    ("Why is the sky blue during the day?", "Why does the sky look blue in the daytime?",
     "Why is the sea blue during the day?"),
    ("What is a good way to learn to cook at home?", "How can I learn cooking at home?",
     "What is a good way to learn to cook at school?"),
    ("How do I keep my houseplants alive in winter?", "How can I keep indoor plants alive during winter?",
     "How do I keep my houseplants alive in summer?"),
]


def replay_pairs_file(folder):
    """REPLAY_PAIRS as a pair file: each source with its rewording and its look-alike."""
    pairs = folder / "pairs.jsonl"
    pairs.write_text("".join(json.dumps({"q1": q1, "q2": q2, "duplicate": dup}) + "\n"
                             for q1, reworded, lookalike in REPLAY_PAIRS
                             for q2, dup in ((reworded, True), (lookalike, False))))
    return pairs


def test_cache_replay_counts_every_hit_and_judges_it_by_the_text_it_served(stack, tmp_path):
    """bench cache-replay against the stack (tiny model; the real embedding and pair model in the
    gateway), through its lenient gateway and with threshold 0 so that look-alikes are served too.
    max_tokens 12 is a namespace of its own: nothing the module's other tests stored can answer it."""
    pairs = replay_pairs_file(tmp_path)
    out = tmp_path / "replay.json"
    done = subprocess.run([sys.executable, "-m", "ops.commands.cli", "bench", "cache-replay", "--url", lenient[stack], "--pairs",
                           str(pairs), "--max-tokens", "12", "--cache-threshold", "0", "--repeat-ratio", "0.3",
                           "--json", str(out)], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(out.read_text())
    assert json.loads(done.stdout) == report
    assert report["fill"]["stored"] == 6 and report["fill"]["not_stored"] == []
    rows, kinds = report["per_request"], report["by_kind"]
    # 12 q2s, and exact repeats making 30% of the whole: 5 of 17.
    assert [kinds[k]["requests"] for k in ("repeat", "rewording", "lookalike")] == [5, 6, 6]
    assert report["requests"] == len(rows) == 17 and report["errors"] == {}
    for kind, k in kinds.items():
        assert k["hits"] + k["misses"] + k["errors"] == k["requests"], kind
        assert k["exact"] + k["semantic"] == k["hits"] == k["right"] + k["wrong"], kind
        assert k["hits"] == sum(r["kind"] == kind and r["cached"] is not None for r in rows), kind
    repeats = [r for r in rows if r["kind"] == "repeat"]
    assert all(r["cached"] == "exact" and r["verdict"] == "right" for r in repeats), repeats
    lookalike_hits = [r for r in rows if r["kind"] == "lookalike" and r["cached"]]
    assert lookalike_hits and all(r["verdict"] == "wrong" for r in lookalike_hits), lookalike_hits
    wrong = sum(r["verdict"] == "wrong" for r in rows)
    hits = sum(r["cached"] is not None for r in rows)
    assert report["wrong_hit_rate"]["count"] == wrong == len(report["wrong_hits"])
    assert report["wrong_hit_rate"]["of"] == report["hit_rate"]["count"] == hits
    lo, hi = report["wrong_hit_rate"]["wilson95"]
    assert lo <= report["wrong_hit_rate"]["value"] <= hi
    saved = report["compute_saved"]
    assert saved["hit_tokens"] == sum(r["completion_tokens"] for r in rows if r["cached"]) > 0
    assert saved["total_tokens"] == sum(r["completion_tokens"] for r in rows)
    assert saved["share"] == round(saved["hit_tokens"] / saved["total_tokens"], 4)
    assert report["latency_ms"]["exact_hit"]["count"] == sum(r["cached"] == "exact" for r in rows)


def test_cache_replay_in_rounds_reads_the_caches_evidence_after_each(stack, tmp_path):
    """--rounds 2: the sources dealt whole into two rounds, each filled and replayed, and the cache's
    evidence (observations, audited error, trained and learned thresholds) read before and after
    each. max_tokens 10: a namespace of its own."""
    pairs = replay_pairs_file(tmp_path)
    out = tmp_path / "rounds.json"
    done = subprocess.run([sys.executable, "-m", "ops.commands.cli", "bench", "cache-replay", "--url", lenient[stack], "--pairs",
                           str(pairs), "--max-tokens", "10", "--cache-threshold", "0", "--repeat-ratio", "0",
                           "--rounds", "2", "--settle", "1", "--redis-url", stack_redis[stack], "--json",
                           str(out)],
                          cwd=ROOT, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(out.read_text())
    rounds = report["rounds"]
    assert [r["round"] for r in rounds] == [1, 2] and sum(r["fill"]["sources"] for r in rounds) == 6
    assert all(r["fill"]["stored"] == r["fill"]["sources"] for r in rounds), rounds
    asked = [{row["source"] for row in report["per_request"][:rounds[0]["requests"]]},
             {row["source"] for row in report["per_request"][rounds[0]["requests"]:]}]
    assert sum(r["requests"] for r in rounds) == report["requests"] == 12 and not asked[0] & asked[1]
    seen = [sum(e["observations"].values()) for e in (report["evidence_before"], *(r["evidence"] for r in rounds))]
    assert seen == sorted(seen), seen  # evidence only accumulates
    for r in rounds:
        e = r["evidence"]
        assert {"served_error", "trained", "floor", "serving", "why"} <= set(e) and e["max_error"] > 0, e
        assert e["served_error"]["audited"] == e["observations"]["audit"]


def test_cache_replay_deals_each_source_whole_into_one_round():
    from ops.bench.cache_replay import dealt
    from ops.training.pair_model.pairs import Pair

    pairs = [Pair(f"q{i % 7}", f"r{i}", i % 2 == 0) for i in range(40)]
    rounds = dealt(pairs, 3, seed=4)
    assert sorted(p.q2 for r in rounds for p in r) == sorted(p.q2 for p in pairs)
    sides = [{p.q1 for p in r} for r in rounds]
    assert all(sides) and not (sides[0] & sides[1] or sides[0] & sides[2] or sides[1] & sides[2])
    assert dealt(pairs, 3, seed=4) == rounds  # the same seed, the same rounds


def test_cache_replay_judges_a_hit_by_its_text_not_by_what_was_asked():
    from ops.bench.cache_replay_judge import Reply, judge, plan_replay
    from ops.training.pair_model.pairs import Pair

    pairs = [Pair("a?", "a, reworded?", True), Pair("b?", "b, reworded?", True), Pair("a?", "b?", False)]
    asks = {a.question: a for a in plan_replay(pairs, 0.0, seed=1)}
    fill = {"a?": Reply("answer a"), "b?": Reply("answer b")}
    served = {"a, reworded?": Reply("answer b", cached="semantic"),  # another source's answer
              "b, reworded?": Reply("answer b", cached="semantic"),
              "b?": Reply("answer b", cached="exact")}  # a look-alike of a that is itself stored
    verdicts = {j.ask.question: (j.verdict, j.served_family) for j in judge(fill, [(asks[q], r) for q, r in
                                                                                  served.items()])}
    assert verdicts == {"a, reworded?": ("wrong", "b?"), "b, reworded?": ("right", None), "b?": ("right", None)}
