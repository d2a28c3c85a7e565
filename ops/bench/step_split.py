"""`brigade bench engine --split`: where a one-stream decode step's milliseconds go.

One greedy request decodes `tokens` tokens with speculation off (one token a step), its context
short (the shipped benchmark question), and each part of each step is timed where it runs:
- `forward`: the model runner's pass (embedding, rotary, every layer, the last norm, the head);
- `layers`: the native decoder's call inside it (every layer: products, norms, attention, SiLU);
- `products`: the 30 layers' four grid products alone, one row each, in a step's order (timed apart,
  weights streamed from memory as in a step); `layers` minus `products` is attention, the norms,
  the rotary embedding, SiLU and the residual sums;
- `head`: the output projection alone, one row (timed apart); `forward` minus `layers` minus
  `head` is the embedding, rotary tables, last norm and the pass's Python;
- `outside_forward`: the step minus its forward pass: scheduling, sampling, detokenizing, the
  engine's Python.

Medians over the steps. A peer's tg128 (llama-bench, `--peer llama-cpp`) gives its whole step in
the same units. The worker's own cost per step (reply events, Redis) is not in an engine step: the
served benchmark's inter-token latency shows it (docs/benchmarks.md).
"""
from __future__ import annotations

import dataclasses
import statistics
import time

import torch

from engine.grid_linear import matmul
from engine.llm_engine import Engine
from engine.sequence import SamplingParams
from engine.engine_request import EngineRequest

QUESTION = "What is the capital of France?"


def _timed(calls: list[float], fn):
    def wrapper(*args, **kwargs):
        started = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            calls.append(time.perf_counter() - started)
    return wrapper


class _TimedDecoder:
    """The native decoder, each call timed (its class is pybind's: wrapped, not patched)."""

    def __init__(self, decoder, calls: list[float]):
        self._decoder, self._calls = decoder, calls

    def forward(self, *args):
        started = time.perf_counter()
        try:
            return self._decoder.forward(*args)
        finally:
            self._calls.append(time.perf_counter() - started)


def _median_ms(fn, repeats: int) -> float:
    fn()
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        fn()
        times.append(time.perf_counter() - started)
    return statistics.median(times) * 1000


def split(engine: Engine, tokens: int = 128) -> dict:
    runner = engine.runner
    weights = runner.primary
    if runner.native is None:
        return {"skipped": f"the native decoder does not serve this model here (storage {weights.storage})"}
    request = EngineRequest("split", SamplingParams(max_tokens=tokens, ignore_eos=True),
                            messages=[{"role": "user", "content": QUESTION}])
    saved = engine.speculation
    engine.speculation = None  # one token a step
    forwards: list[float] = []
    layers: list[float] = []
    native = runner.native
    try:
        engine.generate([dataclasses.replace(request, request_id="split-warm")])
        runner.forward = _timed(forwards, runner.forward)
        runner.native = _TimedDecoder(native, layers)
        started = time.perf_counter()
        engine.generate([request])
        elapsed = time.perf_counter() - started
    finally:
        engine.speculation = saved
        runner.native = native
        del runner.forward
    decode_forwards, decode_layers = forwards[1:], layers[1:]  # the first pass is the prompt's
    hidden = weights.embed.shape[1]
    inner = weights.layers[0].down.shape[1]
    x, act = torch.randn(1, hidden), torch.randn(1, inner)

    def products():
        for layer in weights.layers:
            matmul(x, layer.qkv)
            matmul(x, layer.o)
            matmul(x, layer.gate_up)
            matmul(act, layer.down)

    products_ms = _median_ms(products, 20)
    head_ms = _median_ms(lambda: matmul(x, weights.output), 20)
    forward_ms = statistics.median(decode_forwards) * 1000
    layers_ms = statistics.median(decode_layers) * 1000
    step_ms = elapsed / tokens * 1000
    return {
        "tokens": tokens, "threads": torch.get_num_threads(), "step_ms": round(step_ms, 3),
        "tok_s": round(tokens / elapsed, 1),
        "parts_ms": {
            "layer_products": round(products_ms, 3),
            "attention_norms_rotary_silu": round(layers_ms - products_ms, 3),
            "head": round(head_ms, 3),
            "embedding_last_norm_pass_python": round(forward_ms - layers_ms - head_ms, 3),
            "outside_forward": round(step_ms - forward_ms, 3),
        },
        "forward_ms": round(forward_ms, 3), "layers_ms": round(layers_ms, 3),
    }
