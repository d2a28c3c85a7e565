"""`brigade bench engine --peer llama-cpp`: llama.cpp's own engine benchmark beside Brigade's rows.

`llama-bench -m <default GGUF> -t <threads> -p 512 -n 128 -o json` (built by llama_cpp_build.py):
its prompt rate (pp512: a 512-token prompt in one batch) and its generation rate (tg128: 128 tokens
one at a time, one stream), each the mean of its repetitions, at the thread count Brigade's rows ran
at. The GGUF is the file the default model ships as (4-bit Q4_1 weights), which Brigade's exact
default reads its float32 weights from. This replaced llama-cpp-python run one request after
another: its "16 streams" were one stream sixteen times, which llama-bench's tg128 says directly,
and llama.cpp serving many streams at once is `brigade bench serve --versus llama-server`'s.
"""
from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

from engine.model_files import default_gguf_path

PROMPT_TOKENS = 512
GENERATED_TOKENS = 128


class PeerOutputUnreadable(ValueError):
    """llama-bench's JSON lacks a test this benchmark asked for."""


BUILT_WITH = "built-with.txt"  # in a peer's bin folder: the cmake flags it was built with (llama_cpp_build)


def built_with(folder: Path) -> str:
    """The cmake flags the binaries in `folder` were built with ('' before this was recorded)."""
    record = folder / BUILT_WITH
    return record.read_text().strip() if record.exists() else ""


def bench_argv(binary: Path, gguf: Path, threads: int, prompt_tokens: int = PROMPT_TOKENS,
               generated_tokens: int = GENERATED_TOKENS) -> list[str]:
    return [str(binary), "-m", str(gguf), "-t", str(threads), "-p", str(prompt_tokens), "-n", str(generated_tokens),
            "-o", "json"]


def parse(text: str) -> dict:
    """llama-bench's JSON (a list with one object per test) as `{"pp512": {...}, "tg128": {...}}`:
    each test's mean tok/s, its standard deviation and repetitions, and what it ran on."""
    tests = {}
    for row in json.loads(text):
        if row["n_prompt"] and not row["n_gen"]:
            name = f"pp{row['n_prompt']}"
        elif row["n_gen"] and not row["n_prompt"]:
            name = f"tg{row['n_gen']}"
        else:
            name = f"pp{row['n_prompt']}+tg{row['n_gen']}"
        tests[name] = {"tok_s": round(row["avg_ts"], 2), "stddev_tok_s": round(row["stddev_ts"], 2),
                       "repetitions": len(row.get("samples_ts") or []), "threads": row["n_threads"],
                       "model_type": row.get("model_type"), "cpu_info": row.get("cpu_info"),
                       "build_commit": row.get("build_commit"), "build_number": row.get("build_number")}
    return tests


def peer_environment() -> dict[str, str]:
    """The environment a peer (llama-bench, llama-server) runs in: this one without GOMP_SPINCOUNT,
    which every brigade command sets for its own OpenMP (ops/core/settings.py, openmp_spin). llama.cpp
    uses libgomp too, and it is measured at its own defaults, as its users run it."""
    return {k: v for k, v in os.environ.items() if k != "GOMP_SPINCOUNT"}


def run(binary: Path, threads: int, prompt_tokens: int = PROMPT_TOKENS,
        generated_tokens: int = GENERATED_TOKENS) -> dict:
    """llama-bench (`binary`, as llama_cpp_build.ensure_built made it) at `threads` threads."""
    gguf = default_gguf_path()
    argv = bench_argv(binary, gguf, threads, prompt_tokens, generated_tokens)
    done = subprocess.run(argv, capture_output=True, text=True, check=False, env=peer_environment())
    if done.returncode != 0:
        raise RuntimeError(f"llama-bench failed (exit {done.returncode}): {done.stderr[-2000:]}")
    tests = parse(done.stdout)
    prompt, generated = f"pp{prompt_tokens}", f"tg{generated_tokens}"
    if prompt not in tests or generated not in tests:
        raise PeerOutputUnreadable(f"llama-bench reported {sorted(tests)}, not {prompt} and {generated}")
    return {"name": "llama-bench", "command": " ".join([binary.name, *argv[1:]]), "gguf": gguf.name, "threads": threads,
            "prompt_tok_s": tests[prompt]["tok_s"], "generation_tok_s": tests[generated]["tok_s"], "tests": tests,
            "built_with": built_with(binary.parent)}  # the cmake flags: whether AMX was turned off here


def beside(peer: dict, results: list[dict], prefix_reuse: dict) -> dict:
    """Brigade's own figures beside the peer's: its one-stream rate (the N=1 row) against tg128, and
    its cold prefill rate (the prefix-reuse row's shared prompt over its cold TTFT) against pp512."""
    one = next((r for r in results if r["n"] == 1), None)
    out = {}
    if one is not None:
        out["one_stream_tok_s"] = one["brigade_tok_s"]
        out["one_stream_vs_peer"] = round(one["brigade_tok_s"] / peer["generation_tok_s"], 3)
    if prefix_reuse.get("cold_ttft_s"):
        rate = prefix_reuse["shared_prompt_tokens"] / prefix_reuse["cold_ttft_s"]
        out["cold_prefill_tok_s"] = round(rate, 1)
        out["cold_prefill_vs_peer"] = round(rate / peer["prompt_tok_s"], 3)
    return out
