"""Brigade beside llama.cpp: the peer's build (its cache key, its message when it cannot be built),
llama-bench's report as the engine benchmark reads it, and `bench serve --versus llama-server`'s
plan (which rows, which prompts, which flags each program gets). None of these needs llama.cpp
built; the last test runs the command itself and needs it (`make bench-peers`)."""
from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
# `llama-bench -m <default GGUF> -t 2 -p 512 -n 128 -o json`, as it printed it on this project's
# 2-core machine (AMD EPYC, AVX512_BF16, no AMX).
LLAMA_BENCH_SAMPLE = ROOT / "tests" / "data" / "llama_bench_pp512_tg128.json"


# ---- the build ------------------------------------------------------------------------------------


def test_the_build_key_names_the_version_and_changes_with_the_cpu_and_the_compiler():
    from ops.bench.llama_cpp_build import VERSION, build_key

    flags = frozenset({"avx2", "avx512f", "avx512_bf16"})
    key = build_key(flags, "g++ (Debian 12.2.0-14) 12.2.0")
    assert key.startswith(f"llama.cpp-{VERSION}-")
    assert key == build_key(set(flags), "g++ (Debian 12.2.0-14) 12.2.0")  # the same inputs, the same folder
    assert key != build_key(flags - {"avx512_bf16"}, "g++ (Debian 12.2.0-14) 12.2.0")  # another CPU kind
    assert key != build_key(flags, "g++ (Debian 13.1.0-1) 13.1.0")  # another compiler


def test_the_build_downloads_nothing_at_build_time_and_builds_static_binaries_for_this_cpu():
    from ops.bench.llama_cpp_build import CMAKE_FLAGS, TARGETS

    assert {"-DGGML_NATIVE=ON", "-DLLAMA_BUILD_TESTS=OFF", "-DLLAMA_BUILD_EXAMPLES=OFF"} <= set(CMAKE_FLAGS)
    # llama-server's build fetches a prebuilt web UI from Hugging Face unless told not to.
    assert {"-DLLAMA_USE_PREBUILT_UI=OFF", "-DLLAMA_BUILD_UI=OFF", "-DLLAMA_OPENSSL=OFF"} <= set(CMAKE_FLAGS)
    assert "-DBUILD_SHARED_LIBS=OFF" in CMAKE_FLAGS  # bin/ holds the programs alone, no build tree needed
    assert TARGETS == ("llama-server", "llama-bench")


def test_a_build_is_kept_only_once_its_llama_bench_runs_and_an_amx_cpus_second_build_turns_amx_off(tmp_path):
    """`smoke` runs a built llama-bench on a few tokens: real processes standing in for a build whose
    AMX path dies at its first tile configuration (SIGSEGV), one that fails, and one that runs."""
    from ops.bench.llama_cpp_build import CMAKE_FLAGS, NO_AMX, smoke
    from ops.bench.peer_llama_cpp import built_with

    def program(name: str, body: str) -> Path:
        path = tmp_path / name
        path.write_text(f"#!/bin/sh\n{body}\n")
        path.chmod(0o755)
        return path

    assert smoke(program("dies", "kill -SEGV $$")) == "died of signal 11"
    assert smoke(program("fails", "echo 'no model' >&2; exit 3")) == "exited 3: no model\n"
    assert smoke(program("runs", "exit 0")) is None
    # The second build is the first's flags with AMX's instructions off, for C and C++ alike.
    assert [f.split("=", 1)[0] for f in NO_AMX] == ["-DCMAKE_C_FLAGS", "-DCMAKE_CXX_FLAGS"]
    assert all(f.endswith("-mno-amx-tile -mno-amx-int8 -mno-amx-bf16") for f in NO_AMX)
    assert not set(NO_AMX) & set(CMAKE_FLAGS)
    (tmp_path / "built-with.txt").write_text(" ".join(CMAKE_FLAGS + NO_AMX) + "\n")
    assert built_with(tmp_path).endswith("-mno-amx-bf16") and built_with(tmp_path / "elsewhere") == ""


def test_without_cmake_the_build_says_what_to_install_and_downloads_nothing(tmp_path):
    """A real subprocess whose PATH has no cmake (nor a compiler): exit 2, the missing tools named, the
    make target that installs them, and no sdist fetched."""
    peers = tmp_path / "peers"
    env = dict(os.environ, PATH=str(tmp_path / "empty-bin"), BRIGADE_PEER_DIR=str(peers))
    done = subprocess.run([sys.executable, "-m", "ops.bench.llama_cpp_build"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stderr
    assert "cmake (apt-get install cmake)" in done.stderr and "make bench-peers" in done.stderr
    assert not (peers / "sdist").exists()


def test_the_engine_bench_says_so_before_loading_anything_when_the_peer_cannot_be_built(tmp_path):
    env = dict(os.environ, PATH=str(tmp_path / "empty-bin"), BRIGADE_PEER_DIR=str(tmp_path / "peers"))
    done = subprocess.run([sys.executable, "-m", "ops.commands.cli", "bench", "engine", "--peer", "llama-cpp", "--n", "1"],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "make bench-peers" in done.stderr, done.stderr[-2000:]


# ---- llama-bench beside the engine benchmark ------------------------------------------------------


def test_llama_bench_json_gives_its_prompt_and_generation_rates():
    from ops.bench.peer_llama_cpp import bench_argv, parse

    tests = parse(LLAMA_BENCH_SAMPLE.read_text())
    assert set(tests) == {"pp512", "tg128"}
    for test in tests.values():
        assert test["tok_s"] > 0 and test["stddev_tok_s"] >= 0 and test["threads"] == 2
        assert test["repetitions"] == 5
    assert tests["pp512"]["tok_s"] > tests["tg128"]["tok_s"]  # a prompt in one batch beats one token a step
    argv = bench_argv(Path("/x/llama-bench"), Path("/m/model.gguf"), threads=2)
    assert argv == ["/x/llama-bench", "-m", "/m/model.gguf", "-t", "2", "-p", "512", "-n", "128", "-o", "json"]


def test_brigade_is_set_beside_the_peer_one_stream_against_tg128_and_cold_prefill_against_pp512():
    from ops.bench.peer_llama_cpp import beside

    peer = {"prompt_tok_s": 400.0, "generation_tok_s": 150.0}
    results = [{"n": 1, "brigade_tok_s": 75.0}, {"n": 16, "brigade_tok_s": 190.0}]
    out = beside(peer, results, {"shared_prompt_tokens": 1000, "cold_ttft_s": 4.0})
    assert out == {"one_stream_tok_s": 75.0, "one_stream_vs_peer": 0.5, "cold_prefill_tok_s": 250.0,
                   "cold_prefill_vs_peer": 0.625}
    assert beside(peer, results[1:], {"skipped": "short context"}) == {}


# ---- bench serve --versus llama-server: the plan ----------------------------------------------------


def test_the_default_plan_is_every_prompt_length_at_1_4_16_and_32_in_flight():
    from ops.bench.versus import CONCURRENCIES, plan_rows

    rows = plan_rows(list(CONCURRENCIES), ["short", "long"])
    assert [(r.concurrency, r.prompt) for r in rows] == [(c, p) for c in (1, 4, 16, 32) for p in ("short", "long")]
    assert {r.concurrency: r.requests for r in rows} == {1: 8, 4: 8, 16: 32, 32: 64}  # 2 waves, at least 8
    assert {r.requests for r in plan_rows([1, 16], ["short"], num_requests=10)} == {10}
    with pytest.raises(ValueError, match="medium unknown"):
        plan_rows([1], ["short", "medium"])
    with pytest.raises(ValueError, match="at least 1"):
        plan_rows([0], ["short"])


def test_each_row_comes_with_each_ending_and_the_setups_are_brigades_then_llama_servers():
    from ops.bench.versus import ENDINGS, Setup, plan_rows, plan_setups

    rows = plan_rows([1, 4], ["short"], endings=list(ENDINGS))
    assert [(r.concurrency, r.ending) for r in rows] == [(1, "ignore-eos"), (1, "natural"), (4, "ignore-eos"),
                                                         (4, "natural")]
    assert len({r.tag for r in rows}) == 4  # each its own prompts and results
    with pytest.raises(ValueError, match="sometimes unknown"):
        plan_rows([1], ["short"], endings=["sometimes"])
    setups = plan_setups(["on", "off"], ["none", "ngram-simple"])
    assert [s.name for s in setups] == ["brigade", "brigade-spec-off", "llama-server", "llama-server-ngram-simple"]
    assert setups[3] == Setup("llama-server", "ngram-simple")
    with pytest.raises(ValueError, match="on and/or off"):
        plan_setups(["maybe"], ["none"])


def test_the_ratio_is_brigades_rate_over_the_best_llama_server_setup_of_the_same_run():
    from ops.bench.versus import plan_setups, ratios, summary

    def runs(*rates):
        return [{"output_tok_s": r, "ttft_p50_s": 0.1, "failed": 0, "errors": {}, "short_answers": 0} for r in rates]

    setups = plan_setups(["on", "off"], ["none", "ngram-simple"])
    results = {"brigade": runs(110.0, 100.0, 120.0), "brigade-spec-off": runs(90.0, 95.0, 99.0),
               "llama-server": runs(100.0, 104.0, 100.0), "llama-server-ngram-simple": runs(105.0, 90.0, 98.0)}
    out = ratios(results, setups)
    assert out["best_llama_server_per_run"] == ["llama-server-ngram-simple", "llama-server", "llama-server"]
    mine = out["brigade_vs_best_llama_server"]
    assert mine["per_run"] == [round(110 / 105, 3), round(100 / 104, 3), 1.2]
    assert mine["median"] == round(110 / 105, 3) and mine["min"] == round(100 / 104, 3) and mine["max"] == 1.2
    assert out["brigade-spec-off_vs_best_llama_server"]["median"] == round(95 / 104, 3)
    s = summary(results["brigade"])
    assert s["output_tok_s"] == 110.0 and (s["output_tok_s_min"], s["output_tok_s_max"]) == (100.0, 120.0)
    assert len(s["runs"]) == 3


def test_each_prompt_is_about_as_long_as_asked_its_own_from_its_first_words_and_the_same_every_run():
    from ops.bench.versus import build_prompts

    questions = [f"What is question number {i} about?" for i in range(50)]
    words = lambda text: len(text.split())  # noqa: E731 (a stand-in for the model's tokenizer)
    long = build_prompts(questions, 6, 200, words, "long-c4")
    assert all(abs(words(p) - 200) <= 3 for p in long)  # a question is 6 words: the nearest cut is within 3
    short = build_prompts(questions, 6, 20, words, "short-c4")
    firsts = [p.split(".")[0] for p in long + short]
    assert len(set(firsts)) == len(firsts)  # no prompt starts as another does, in a row or across rows
    assert build_prompts(questions, 6, 200, words, "long-c4") == long  # both programs get the same prompts


def test_llama_server_gets_a_slot_per_request_in_flight_each_with_room_for_a_long_prompt_and_its_answer():
    from ops.bench.llama_server import server_argv, slot_tokens

    assert slot_tokens(1024, 128) == 1280 and slot_tokens(70, 128) == 512
    argv = server_argv(Path("/x/llama-server"), Path("/m/model.gguf"), slots=16, context_per_slot=1280, threads=2,
                       port=8123)
    flags = dict(zip(argv[1::2], argv[2::2]))
    assert flags["-np"] == "16" and flags["-c"] == str(16 * 1280) and flags["-t"] == flags["-tb"] == "2"
    assert flags["-m"] == "/m/model.gguf" and flags["--port"] == "8123" and flags["--host"] == "127.0.0.1"
    assert "--cont-batching" in argv and "--no-webui" in argv


# A stand-in llama-server: writes the environment it was given, then answers /health.
_STAND_IN_SERVER = """
import http.server, json, os, sys
port = int(sys.argv[sys.argv.index("--port") + 1])
with open(os.environ["STAND_IN_ENV_OUT"], "w") as f:
    json.dump(dict(os.environ), f)
class Health(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200)
        self.end_headers()
    def log_message(self, *args):
        pass
http.server.HTTPServer(("127.0.0.1", port), Health).serve_forever()
"""


def test_the_peer_runs_at_its_own_openmp_defaults_not_the_spin_brigade_sets_for_itself(tmp_path, monkeypatch):
    # llama.cpp uses libgomp too: the GOMP_SPINCOUNT every brigade command puts in its environment
    # (ops/core/settings.py, openmp_spin) must not reach the program measured beside it.
    from ops.bench.llama_server import LlamaServer

    stand_in = tmp_path / "llama-server"
    stand_in.write_text(f"#!{sys.executable}\n{_STAND_IN_SERVER}")
    stand_in.chmod(0o755)
    monkeypatch.setenv("GOMP_SPINCOUNT", "1000")
    monkeypatch.setenv("STAND_IN_ENV_OUT", str(tmp_path / "env.json"))
    with LlamaServer(stand_in, Path("/m/model.gguf"), slots=1, context_per_slot=512, threads=1, log=tmp_path / "log"):
        given = json.loads((tmp_path / "env.json").read_text())
    assert "GOMP_SPINCOUNT" not in given and given["STAND_IN_ENV_OUT"] == str(tmp_path / "env.json")


def test_both_programs_get_the_same_streamed_greedy_load_with_ignore_eos_and_no_answer_cache(tmp_path):
    from ops.bench.serve_config import LoadConfig
    from ops.bench.serve_workload import load_dataset
    from ops.bench.versus import Row, row_load, write_dataset

    base = LoadConfig(backend="ws", url="ws://elsewhere/v1/ws", http_base="http://elsewhere", model="m",
                      rate=1.0, burstiness=1.0, max_concurrency=None, num_requests=100, duration_s=None,
                      max_tokens=128, dataset=None, repeat_ratio=0.5, seed=3, temperature=0.0, cache="auto",
                      timeout_s=900.0, api_key="k", redis_url="redis://x")
    dataset = write_dataset(["one", "two", "three", "four"], 128, tmp_path / "p.jsonl")
    row = Row("short", 4, 8)
    loads = [row_load(base, url, row, dataset, (0, 2)) for url in ("http://127.0.0.1:1", "http://127.0.0.1:2")]
    for load, url in zip(loads, ("http://127.0.0.1:1", "http://127.0.0.1:2")):
        assert load.backend == "openai" and load.url == url + "/v1/chat/completions" and load.http_base == url
        assert load.max_concurrency == 4 and load.num_requests == 8 and math.isinf(load.rate)
        assert load.ignore_eos and load.cache is None and load.repeat_ratio == 0 and load.max_tokens == 128
        assert load.api_key is None and load.redis_url is None and load.model is None
        # The end tokens banned for both: llama-server's ignore_eos means that, Brigade's alone would not.
        assert load.logit_bias == {0: -100.0, 2: -100.0}
    assert loads[0].to_json() | {"url": None} == loads[1].to_json() | {"url": None}
    assert [p.max_tokens for p in load_dataset(dataset)] == [128] * 4
    natural = row_load(base, "http://127.0.0.1:1", Row("short", 4, 8, "natural"), dataset, (0, 2))
    assert not natural.ignore_eos and natural.logit_bias is None and natural.max_tokens == 256


def test_the_end_tokens_are_the_models_end_of_sequence_and_chat_end_markers():
    from ops.bench.versus import end_tokens
    from ops.core.settings import Settings

    ids = end_tokens(Settings().model_dir)
    assert 2 in ids and 0 in ids  # SmolLM2: <|im_end|> (its eos) and <|endoftext|>


def test_a_load_with_a_logit_bias_sends_it_as_the_openai_api_names_it():
    from ops.bench.serve_backends import OpenAIBackend
    from ops.bench.serve_config import LoadConfig
    from ops.bench.serve_workload import PlannedRequest

    config = LoadConfig(backend="openai", url="http://x/v1/chat/completions", http_base="http://x", model="m",
                        rate=1.0, burstiness=1.0, max_concurrency=None, num_requests=1, duration_s=None,
                        max_tokens=8, dataset=None, repeat_ratio=0.0, seed=3, temperature=0.0, cache=None,
                        timeout_s=9.0, ignore_eos=True, logit_bias={2: -100.0})
    body = OpenAIBackend(config).body(PlannedRequest(0, ({"role": "user", "content": "hi"},), 8, "fresh", None))
    assert body["logit_bias"] == {"2": -100.0} and body["ignore_eos"] is True


def test_the_table_and_the_plot_show_every_setup(tmp_path):
    from ops.bench.plot import plot_versus
    from ops.bench.versus import plan_setups, ratios, summary, table_lines

    def runs(tok_s):
        return [{"output_tok_s": tok_s + i, "ttft_p50_s": 0.06, "ttft_p95_s": 1.7, "itl_p50_s": 0.07,
                 "itl_p99_s": 0.083, "e2e_p50_s": 2.0, "errors": {}, "failed": 0, "short_answers": 0}
                for i in (0, -2, 3)]

    setups = plan_setups(["on", "off"], ["none"])
    rates = {"brigade": 60.0, "brigade-spec-off": 55.0, "llama-server": 120.0}
    rows = [{"prompt": p, "concurrency": c, "requests": 4, "ending": e, "prompt_tokens_mean": t,
             "setups": {name: summary(runs(r)) for name, r in rates.items()},
             "ratios": ratios({name: runs(r) for name, r in rates.items()}, setups)}
            for p, t in (("short", 66), ("long", 1004)) for c in (1, 16) for e in ("ignore-eos", "natural")]
    report = {"rows": rows, "threads": 2, "max_tokens": 128, "runs": 3, "cpu": {"model_name": "AMD EPYC"},
              "setups": [s.name for s in setups]}
    lines = table_lines(report)
    assert len(lines) == 2 + 3 * len(rows)
    assert ("| short (66 tok) | 1 | ignore-eos | brigade | 60.0 (58.0-63.0) | 60 ms | 70 ms | 83 ms | 0 | "
            "0.50x (0.49-0.51) |") in lines, lines[:4]
    plot_versus(report, str(tmp_path / "versus.png"))
    assert (tmp_path / "versus.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


# ---- the command itself (needs llama.cpp built) -----------------------------------------------------


@pytest.mark.peers
def test_versus_runs_the_same_load_against_brigade_and_llama_server(tmp_path):
    """The smallest whole run: 2 requests at 2 in flight with short prompts, 8 tokens each, against a
    Brigade of its own and a llama-server; both answer every request with every token asked."""
    from ops.bench.llama_cpp_build import bin_dir, built
    from ops.core.settings import Settings

    folder = bin_dir(Settings().peers_dir)
    if built(folder) is None:
        pytest.fail(f"llama.cpp's llama-server is not built in {folder}: run `make bench-peers`")
    out, plot = tmp_path / "versus.json", tmp_path / "versus.png"
    env = {k: v for k, v in os.environ.items() if k != "BRIGADE_MODEL"}
    done = subprocess.run([sys.executable, "-m", "ops.commands.cli", "bench", "serve", "--versus", "llama-server",
                           "--concurrency", "2", "--prompt-lengths", "short", "--num-requests", "2", "--max-tokens",
                           "8", "--runs", "2", "--json", str(out), "--plot", str(plot)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(out.read_text())
    assert report["setups"] == ["brigade", "brigade-spec-off", "llama-server", "llama-server-ngram-mod"]
    fixed, natural = report["rows"]
    assert (fixed["ending"], natural["ending"]) == ("ignore-eos", "natural")
    for name, setup in fixed["setups"].items():
        assert len(setup["runs"]) == 2, name
        for run in setup["runs"]:
            assert run["completed"] == 2 and run["failed"] == 0, (name, run)
            assert run["output_tokens"] == 16 and run["short_answers"] == 0, (name, run)  # 8 tokens each, every time
    for name, setup in natural["setups"].items():
        assert all(run["completed"] == 2 and 2 <= run["output_tokens"] <= 32 for run in setup["runs"]), name
    assert len(fixed["ratios"]["brigade_vs_best_llama_server"]["per_run"]) == 2
    # Each run its own prompts (a Brigade keeps its prefix cache from run to run; llama-servers restart).
    logs = Path(report["logs"])
    assert (logs / "prompts-short-c2-ignore-eos-run1.jsonl").read_text() != (
        logs / "prompts-short-c2-ignore-eos-run2.jsonl").read_text()
    argv = report["llama_server"]["argv"]
    assert argv["llama-server"]["2"].startswith("llama-server -m ") and "--spec-type" not in argv["llama-server"]["2"]
    assert argv["llama-server-ngram-mod"]["2"].endswith("--spec-type ngram-mod")
    assert "| brigade |" in done.stderr and "| llama-server-ngram-mod |" in done.stderr
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
