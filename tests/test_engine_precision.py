"""The precision modes on the real model, against float32 (which equals Hugging Face generate,
tests/test_engine_real_model.py), and the device setting."""
from __future__ import annotations

import math

import pytest
import torch

from engine import Engine, EngineConfig, EngineRequest, SamplingParams
from engine.kv_cache import SequenceKV
from engine.placement import PlacementError, resolve
from engine.sequence import Chunk, Sequence

# Held out: written for this test, in no training set the cache or the engine uses.
TEXT = (
    "The harbour town woke slowly. Fishing boats came in with the tide, and the market opened "
    "before the sun had cleared the hills. A baker carried trays of bread across the square while "
    "two children chased a dog between the stalls. At the end of the pier an old man mended nets, "
    "as he had every morning for forty years, and told anyone who stopped that the weather would "
    "turn by noon. Nobody believed him, and by noon it had. The rain came in sideways off the sea, "
    "the awnings flapped and emptied, and the square was left to the gulls. In the café on the "
    "corner the owner wiped the counter, switched on the radio and waited for the first customers "
    "of the afternoon, who always came in shaking their umbrellas and complaining about the forecast."
)
QUESTIONS = [
    "What is the capital of France?", "Write a haiku about the sea.", "List three colors.",
    "Explain why the sky is blue in two sentences.", "What is 2 + 2?", "Name a fruit.",
    "How do airplanes stay in the air?", "Give me a recipe for pancakes.",
    "What are the differences between TCP and UDP?", "Translate 'good morning' into Spanish.",
]


def perplexity(engine: Engine, ids: list[int], fast: bool = False) -> float:
    """Perplexity of a text's token ids under the primary copy of the weights, or the fast copy
    (`fast`: what decode steps use; the same copy unless the precision is mixed): one pass that
    keeps every position's logits, for checking a precision mode against float32."""
    seq = Sequence("perplexity", ids, SamplingParams(), seed=0)
    seq.kv = SequenceKV(engine.kv_shape, len(ids))
    runner = engine.runner
    weights = (runner.fast or runner.primary) if fast else runner.primary
    logits = runner.forward([Chunk(seq, 0, len(ids))], every_position=True, weights=weights)
    nll = torch.nn.functional.cross_entropy(logits[:-1], torch.tensor(ids[1:], device=logits.device))
    return math.exp(float(nll))


def greedy(engine: Engine, n: int) -> dict[str, list[int]]:
    requests = [EngineRequest(f"q{i}", SamplingParams(max_tokens=n, ignore_eos=True),
                              messages=[{"role": "user", "content": q}]) for i, q in enumerate(QUESTIONS)]
    return {rid: c.token_ids for rid, c in engine.generate(requests).items()}


@pytest.fixture(scope="module")
def reference(engine):
    return {"ppl": perplexity(engine, engine.tokenizer(TEXT)["input_ids"]), "tokens": greedy(engine, 16)}


@pytest.mark.real_model
@pytest.mark.parametrize("dtype", ["bfloat16", "mixed"])
def test_half_precision_modes_stay_close_to_float32(model_dir, reference, dtype):
    fast = Engine.load(EngineConfig(model=str(model_dir), max_wait_ms=0, torch_threads=2, dtype=dtype))
    assert fast.placement.dtype == dtype
    ids = fast.tokenizer(TEXT)["input_ids"]
    # The copy decode steps use, teacher-forced over the whole text: within 2% of float32.
    assert abs(perplexity(fast, ids, fast=True) / reference["ppl"] - 1) < 0.02
    tokens = greedy(fast, 16)
    same = sum(tokens[rid] == reference["tokens"][rid] for rid in tokens)
    # Greedy decoding of a small model amplifies rounding: long answers drift apart (see the
    # closing figures in docs/architecture.md), but most start the same way.
    assert same >= len(QUESTIONS) // 2, f"{dtype}: {same}/{len(QUESTIONS)} answers start as float32's"


def test_device_and_precision_settings_resolve_or_say_what_to_do():
    cpu = resolve("cpu", "float32")
    assert cpu.device.type == "cpu" and cpu.kv_dtype.is_floating_point
    # The exact default: float32 on every device kind until a faster mode passes its gate there.
    assert resolve("auto", "auto").dtype == "float32"
    assert resolve("cpu", "auto").dtype == "float32"
    assert resolve("cpu", "mixed").fast_dtype is not None
    with pytest.raises(PlacementError, match="float32"):
        resolve("cpu", "int3")
    with pytest.raises(PlacementError, match="auto, cpu, cuda"):
        resolve("tpu")
    if not torch.cuda.is_available():
        with pytest.raises(PlacementError, match="sees no CUDA device"):
            resolve("cuda:0")
