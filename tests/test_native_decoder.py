"""Every decoder layer in one native call (engine/csrc/decoder.cpp): the Python loop's numbers,
bit for bit, in every kind of pass a server makes."""
from __future__ import annotations

import torch

from engine import Engine, EngineConfig, EngineRequest, SamplingParams

PROMPTS = ["Hello there", "The capital of France is", "1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20",
           "Once upon a time " * 12]


def passes(engine: Engine) -> tuple[dict[str, list[int]], list[torch.Tensor]]:
    """The answers to PROMPTS served at once, and every pass's logits on the way."""
    logits: list[torch.Tensor] = []
    forward = type(engine.runner).forward

    def recorded(*args, **kwargs):
        out = forward(engine.runner, *args, **kwargs)
        logits.append(out.clone())
        return out

    engine.runner.forward = recorded
    try:
        # Small chunks: the long prompts are prefilled in pieces beside the others' decode steps.
        requests = [EngineRequest(f"p{i}", SamplingParams(max_tokens=10, ignore_eos=True, prompt_logprobs=1), prompt=p)
                    for i, p in enumerate(PROMPTS)]
        done = engine.generate(requests)
    finally:
        del engine.runner.forward
    return {k: v.token_ids for k, v in done.items()}, logits


def test_the_native_layers_compute_the_python_loops_bits_in_every_pass(grid_tiny):
    engine = Engine.load(EngineConfig(model=str(grid_tiny), torch_threads=2, max_wait_ms=0, prefill_chunk_tokens=8,
                                      prefix_cache=False))
    assert engine.runner.native is not None, "the grid model should be served by the native decoder"
    native_answers, native_logits = passes(engine)
    native = engine.runner.native
    engine.runner.native = None  # the Python loop, on the same weights and caches
    try:
        loop_answers, loop_logits = passes(engine)
    finally:
        engine.runner.native = native
    assert native_answers == loop_answers
    assert len(native_logits) == len(loop_logits) > len(PROMPTS)
    # Passes of several rows: prompt chunks (every position, for prompt_logprobs) beside decode steps.
    assert max(t.shape[0] for t in native_logits) > len(PROMPTS)
    for step, (a, b) in enumerate(zip(native_logits, loop_logits)):
        assert torch.equal(a, b), f"pass {step} differs"


def test_a_model_off_the_grids_is_served_by_the_python_loop(tiny_model_dir):
    engine = Engine.load(EngineConfig(model=str(tiny_model_dir), torch_threads=1, max_wait_ms=0))
    assert engine.runner.primary.storage == "float32" and engine.runner.native is None
    done = engine.generate([EngineRequest("a", SamplingParams(max_tokens=4, ignore_eos=True), prompt="Hello")])
    assert len(done["a"].token_ids) == 4


def test_the_kernels_rms_norm_is_llamas_and_a_rows_bits_do_not_depend_on_the_rows_beside_it():
    import torch.nn.functional as F

    from engine.kernels import kernels

    g = torch.Generator().manual_seed(0)
    x, weight = torch.randn(37, 576, generator=g) * 3, torch.randn(576, generator=g)
    y = kernels().rms_norm(x, weight, 1e-5)
    assert torch.allclose(y, F.rms_norm(x, (576,), weight, 1e-5), rtol=1e-6, atol=1e-6)
    for start, rows in ((0, 1), (5, 1), (3, 17), (36, 1)):
        assert torch.equal(kernels().rms_norm(x[start:start + rows], weight, 1e-5), y[start:start + rows])
    # A width that is not a multiple of the 16 partial sums, and the epsilon used.
    odd = torch.randn(4, 50, generator=g)
    assert torch.allclose(kernels().rms_norm(odd, torch.ones(50), 0.5), F.rms_norm(odd, (50,), torch.ones(50), 0.5),
                          rtol=1e-6, atol=1e-6)
