"""`brigade bench engine`: Hugging Face `generate` one request after another, against this
engine serving the same requests at once, on the same model object, in one run.

Both sides produce exactly `max_tokens` tokens per request (end-of-sequence is ignored), so
tokens per second compare like for like.
"""
from __future__ import annotations

import statistics
import time

import torch

from engine.llm_engine import Engine, EngineRequest
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
    model, tok = engine.model, engine.tokenizer
    started = time.perf_counter()
    for r in requests:
        ids = torch.tensor([engine.encode(r)])
        with torch.inference_mode():
            model.generate(
                ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=max_tokens,
                min_new_tokens=max_tokens, pad_token_id=tok.pad_token_id or tok.eos_token_id,
            )
    return time.perf_counter() - started


def brigade_seconds(engine: Engine, requests: list[EngineRequest]) -> tuple[float, list[float]]:
    started = time.perf_counter()
    done = engine.generate(requests)
    elapsed = time.perf_counter() - started
    return elapsed, [c.timing["ttft_s"] for c in done.values()]


def run(engine: Engine, ns: list[int], max_tokens: int) -> dict:
    engine.generate(bench_requests(2, 4))  # warm-up: first-call allocations stay out of the figures
    results = []
    for n in ns:
        requests = bench_requests(n, max_tokens)
        tokens = n * max_tokens
        base = baseline_seconds(engine, requests, max_tokens)
        ours, ttfts = brigade_seconds(engine, bench_requests(n, max_tokens))
        results.append({
            "n": n,
            "tokens": tokens,
            "baseline_s": round(base, 2),
            "brigade_s": round(ours, 2),
            "baseline_tok_s": round(tokens / base, 2),
            "brigade_tok_s": round(tokens / ours, 2),
            "ratio": round(base / ours, 2),
            "brigade_ttft_median_s": round(statistics.median(ttfts), 3),
        })
        print(results[-1], flush=True)
    return {
        "max_tokens": max_tokens,
        "torch_threads": torch.get_num_threads(),
        "model": engine.config.model,
        "results": results,
    }
