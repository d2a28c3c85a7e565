"""`brigade bench engine`: Hugging Face `generate` one request after another, against this
engine serving the same requests at once, on the same model object, in one run; then prefix
reuse (a 1,000-token system prompt, cold and cached), the streams' inter-token latency while a
1,500-token prompt loads, and optionally a peer (`--peer llama-cpp`: llama-bench's pp512 and tg128 at
the same thread count, ops/bench/peer_llama_cpp.py).

Both sides produce exactly `max_tokens` tokens per request (end-of-sequence is ignored), so
tokens per second compare like for like. Hugging Face serves requests one after another, so its
rate does not depend on N: it is timed once, on `baseline_requests` of the same mix (every N with
`full_baseline`). Progress goes to stderr; the report is returned (the CLI prints it as JSON).
"""
from __future__ import annotations

import dataclasses
import statistics
import sys
import time
from contextlib import contextmanager
from functools import lru_cache
from pathlib import Path

import torch

from engine.checkpoint import transformers_model
from engine.llm_engine import Engine, EngineConfig, EngineRequest
from engine.placement import cpu_flags, resolve
from engine.sequence import SamplingParams

# Mixed lengths on purpose: prefill and padding costs show up as they would in traffic.
QUESTIONS = [
    "What is the capital of France?",
    "Write a haiku about the sea.",
    "Explain in detail how a hash map handles collisions, comparing open addressing with separate "
    "chaining, and say when you would choose each one in a real system.",
    "List three colors.",
    "Summarise the plot of a story in which a lighthouse keeper finds a message in a bottle, "
    "decides to follow its directions across the sea, meets the writer, and learns that the message "
    "was written fifty years earlier by someone who has been waiting for an answer ever since.",
    "Why is the sky blue?",
    "Give me a recipe for pancakes with the quantities of every ingredient.",
    "What are the differences between TCP and UDP, and which one would you use for a video call?",
]


def bench_requests(n: int, max_tokens: int) -> list[EngineRequest]:
    params = SamplingParams(max_tokens=max_tokens, ignore_eos=True)
    return [
        EngineRequest(f"bench-{i}", params, messages=[{"role": "user", "content": QUESTIONS[i % len(QUESTIONS)]}])
        for i in range(n)
    ]


def baseline_seconds(engine: Engine, requests: list[EngineRequest], max_tokens: int) -> float:
    """Hugging Face generate on transformers' own model of the engine's folder, one request after
    another."""
    placement = engine.placement
    model, tok = reference_model(engine.config.model, placement.load_dtype, placement.device), engine.tokenizer
    started = time.perf_counter()
    for r in requests:
        ids = torch.tensor([engine.encode(r)], device=model.device)
        with torch.inference_mode():
            model.generate(
                ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=max_tokens,
                min_new_tokens=max_tokens, pad_token_id=tok.pad_token_id or tok.eos_token_id,
            )
    return time.perf_counter() - started


@lru_cache(maxsize=1)
def reference_model(folder: str, dtype: torch.dtype, device: torch.device):
    """transformers' model of `folder`, read once per run."""
    return transformers_model(Path(folder), dtype, device).eval()


def brigade_seconds(engine: Engine, requests: list[EngineRequest]) -> tuple[float, list[float]]:
    started = time.perf_counter()
    done = engine.generate(requests)
    elapsed = time.perf_counter() - started
    return elapsed, [c.timing["ttft_s"] for c in done.values()]


def throughput(engines: dict[str, Engine], ns: list[int], max_tokens: int, baseline_requests: int = 4,
               full_baseline: bool = False, progress=None) -> list[dict]:
    """HF generate one request after another, against each engine serving the same requests at
    once: the default first, then the modes beside it (float32, ...), named by `engines`' keys."""
    default = next(iter(engines.values()))
    hf_rate = None
    if not full_baseline:
        k = min(baseline_requests, max(ns))
        with _task(progress, f"HF generate, {k} requests one after another"):
            hf_rate = k * max_tokens / baseline_seconds(default, bench_requests(k, max_tokens), max_tokens)
    results = []
    for n in ns:
        tokens = n * max_tokens
        if full_baseline:
            with _task(progress, f"HF generate, {n} requests one after another"):
                hf_rate = tokens / baseline_seconds(default, bench_requests(n, max_tokens), max_tokens)
        row = {"n": n, "tokens": tokens, "baseline_tok_s": round(hf_rate, 2)}
        for name, engine in engines.items():
            with _task(progress, f"{name}: {n} requests at once"):
                seconds, ttfts = brigade_seconds(engine, bench_requests(n, max_tokens))
            prefix = "brigade" if engine is default else name
            row.update({f"{prefix}_tok_s": round(tokens / seconds, 2), f"{prefix}_ratio": round(tokens / seconds / hf_rate, 2)})
            if engine is default:
                row.update(brigade_s=round(seconds, 2), brigade_ttft_median_s=round(statistics.median(ttfts), 3))
        results.append(row)
        _say(row)
    return results


@contextmanager
def _task(progress, description: str):
    """One step of the run on the progress display (a spinner and elapsed time on a terminal)."""
    if progress is None:
        yield
        return
    task = progress.add_task(description, total=1)
    try:
        yield
    finally:
        progress.update(task, completed=1)


def _say(row) -> None:
    print(row, file=sys.stderr, flush=True)


# A system prompt of about 1,000 tokens, the same for every request (bench_prefix_reuse).
SYSTEM_PROMPT = " ".join(
    f"Rule {i}: answer politely, cite the manual section {i} when it applies, and never reveal internal "
    f"ticket number {1000 + i}." for i in range(33)
)


def prefix_reuse(engine: Engine, repeats: int = 3) -> dict:
    """Time to first token of a request whose 1,000-token system prompt is cached, against the
    same request with the cache emptied first (cold)."""
    def ask(i: int) -> float:
        messages = [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": QUESTIONS[i % len(QUESTIONS)]}]
        done = engine.generate([EngineRequest(f"prefix-{i}-{time.monotonic_ns()}", SamplingParams(max_tokens=1), messages=messages)])
        return next(iter(done.values())).timing["ttft_s"]

    prompt_tokens = len(engine.encode(EngineRequest("x", messages=[{"role": "system", "content": SYSTEM_PROMPT}])))
    if prompt_tokens + 64 > engine.context_length:
        return {"skipped": f"the model's context ({engine.context_length} tokens) is shorter than the "
                           f"{prompt_tokens}-token shared prompt and a question"}
    cold, warm = [], []
    for i in range(repeats):
        engine.prefix.clear()
        cold.append(ask(i))
        warm.append(ask(i + 1))
    c, w = statistics.median(cold), statistics.median(warm)
    return {"shared_prompt_tokens": prompt_tokens, "cold_ttft_s": round(c, 4), "warm_ttft_s": round(w, 4),
            "speedup": round(c / w, 2)}


def itl_during_long_prefill(engine: Engine, streams: int = 16, prompt_tokens: int = 1500) -> dict:
    """Inter-token latency of `streams` decoding streams while a `prompt_tokens` prompt arrives:
    the p99 during its prefill against the median of the whole run (before, during and after)."""
    long_ids = list(range(3, 3 + prompt_tokens))  # token ids; their meaning does not matter for timing
    engine.prefix.clear()  # the long prompt must be computed, not found cached from an earlier run
    params = SamplingParams(max_tokens=4000, ignore_eos=True)
    for r in bench_requests(streams, 1):
        engine.add_request(EngineRequest(r.request_id + "-itl", params, messages=r.messages))
    last: dict[str, float] = {}
    gaps: list[tuple[float, float]] = []  # (time, gap)
    window: list[float] = []

    def steps(k: int, stop_at: str | None = None) -> None:
        for _ in range(k):
            for u in engine.step():
                now = time.perf_counter()
                if u.request_id == stop_at:
                    window.append(now)
                    return
                if u.request_id in last:
                    gaps.append((now, now - last[u.request_id]))
                last[u.request_id] = now

    while len(last) < streams:  # until every stream decodes (an idle engine first waits max_wait_ms)
        steps(1)
    steps(20)
    start = time.perf_counter()
    window.append(start)
    engine.add_request(EngineRequest("long-prompt", SamplingParams(max_tokens=1), prompt_ids=long_ids))
    steps(100_000, stop_at="long-prompt")
    steps(20)
    for rid in [s.request_id for s in list(engine.scheduler.running) + list(engine.scheduler.waiting)]:
        engine.cancel(rid)
    engine.step()
    during = [g for t, g in gaps if window[0] < t <= window[1]]
    median = statistics.median(g for _, g in gaps)
    p99 = sorted(during)[max(0, int(len(during) * 0.99) - 1)] if during else None
    return {"streams": streams, "prompt_tokens": prompt_tokens, "chunk_tokens": engine.scheduler.config.prefill_chunk_tokens,
            "long_prompt_ttft_s": round(window[1] - window[0], 3), "itl_median_s": round(median, 4),
            "itl_p99_during_prefill_s": round(p99, 4) if p99 else None,
            "ratio": round(p99 / median, 2) if p99 else None}


# Modes timed beside the default (`--compare`): float32 with ordinary (MKL) products, deterministic
# as the default is and not, and bfloat16, the fastest opt-in mode from a few streams on. A mode
# that is the default's own is not timed twice.
DEFAULT_COMPARE = ("float32-mkl-invariant", "float32-mkl", "bfloat16")
VARIANTS = ("invariant", "unpadded", "mkl")


def comparison_config(engine: Engine, mode: str) -> EngineConfig:
    """The default engine's config in another mode: a precision (BRIGADE_DTYPE), with `-invariant`
    for deterministic mode (engine/batch_invariance.py; without it, or with `-unpadded`, not), and
    `-mkl` for ordinary float32 products instead of weights read from their grid
    (engine/grid_linear.py)."""
    dtype, *variants = mode.split("-")
    if any(v not in VARIANTS for v in variants):
        raise ValueError(f"--compare {mode}: a mode is a BRIGADE_DTYPE, optionally with -invariant or "
                         "-unpadded, and -mkl")
    return dataclasses.replace(engine.config, dtype=dtype, batch_invariant="invariant" in variants,
                               grid_weights="mkl" not in variants)


def comparison_engine(engine: Engine, mode: str) -> Engine:
    """Another engine in `mode` (comparison_config) on the same model object."""
    return Engine(engine.model, engine.tokenizer, comparison_config(engine, mode))


def same_mode(engine: Engine, config: EngineConfig) -> bool:
    """Whether `config` would run as `engine` does (auto resolved): no need to time it twice."""
    return ((resolve(config.device, config.dtype).dtype, config.batch_invariant, config.grid_weights)
            == (engine.placement.dtype, engine.config.batch_invariant, engine.config.grid_weights))


def run(engine: Engine, ns: list[int], max_tokens: int, llama_bench: Path | None = None,
        compare: tuple[str, ...] = DEFAULT_COMPARE, full_baseline: bool = False, long_rows: bool = True) -> dict:
    """The report; `llama_bench`: the peer's binary (ops/bench/llama_cpp_build.py), run beside the
    rows at the same thread count (None: no peer)."""
    from rich.console import Console
    from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    engines = {"default": engine}
    for mode in compare:
        if not same_mode(engine, comparison_config(engine, mode)):
            engines[mode.replace("-", "_")] = comparison_engine(engine, mode)
    for e in engines.values():
        e.generate(bench_requests(2, 4))  # warm-up: first-call allocations stay out of the figures
    started = time.perf_counter()
    report = {
        "max_tokens": max_tokens,
        "torch_threads": torch.get_num_threads(),
        "model": engine.config.model,
        "device": str(engine.placement.device),
        "dtype": engine.placement.dtype,
        "batch_invariant": engine.config.batch_invariant,
        "row_quantum": engine.runner.primary.quantum,
        "weights": engine.runner.primary.storage,
        "cpu_flags": sorted(cpu_flags() & PRECISION_FLAGS),
        "compared": [m for m in compare if m.replace("-", "_") in engines],
        "max_batch": engine.config.max_batch,
    }
    # On stderr: stdout carries the JSON report alone.
    with Progress(SpinnerColumn(), TextColumn("{task.description}"), TimeElapsedColumn(), console=Console(stderr=True),
                  disable=not sys.stderr.isatty(), transient=False) as progress:
        report["results"] = throughput(engines, ns, max_tokens, full_baseline=full_baseline, progress=progress)
        with _task(progress, "prefix reuse: a 1,000-token system prompt, cold and cached"):
            report["prefix_reuse"] = prefix_reuse(engine)
        _say(report["prefix_reuse"])
        with _task(progress, "one stream, speculation off and on: chat, quoting a text, editing code"):
            from ops.bench import speculation

            report["speculation"] = speculation.run(engine)
        _say(report["speculation"])
        if long_rows:
            with _task(progress, "16 streams while a 1,500-token prompt loads in chunks"):
                report["long_prefill"] = itl_during_long_prefill(engine)
            _say(report["long_prefill"])
            # The same with the prompt in one pass (no chunking), as the engine did before.
            chunked = engine.scheduler.config
            engine.scheduler.config = dataclasses.replace(chunked, prefill_chunk_tokens=chunked.max_prefill_tokens)
            try:
                with _task(progress, "the same in one pass (no chunking)"):
                    report["long_prefill_unchunked"] = itl_during_long_prefill(engine)
            finally:
                engine.scheduler.config = chunked
            _say(report["long_prefill_unchunked"])
        if llama_bench is not None:
            from ops.bench import peer_llama_cpp

            with _task(progress, f"llama-bench: pp512 and tg128 at {report['torch_threads']} threads"):
                report["peer"] = peer_llama_cpp.run(llama_bench, report["torch_threads"])
            report["peer"]["brigade"] = peer_llama_cpp.beside(report["peer"], report["results"], report["prefix_reuse"])
            _say(report["peer"])
    report["wall_s"] = round(time.perf_counter() - started, 1)
    return report


# The instruction sets that decide which precision is fast here (engine/placement.py).
PRECISION_FLAGS = {"avx2", "avx512f", "avx512_bf16", "amx_bf16", "avx512_fp16", "f16c", "fma"}
