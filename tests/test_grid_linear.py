"""Weights read from their grid (engine/grid_linear.py): found only where they lie on one exactly,
the same numbers as the float32 matrix, and every row's bits independent of the pass around it."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from engine import grid_store
from engine.batch_invariance import row_quantum
from engine.grid_linear import PANEL_FROM, GridMatrix, pack
from engine.kernels import kernels


def q4_matrix(rows: int, cols: int, seed: int = 0) -> torch.Tensor:
    """A float32 matrix made as GGUF's Q4_1 makes one: scale and low in float16, then
    (scale * q) + low rounded to float32 twice."""
    g = torch.Generator().manual_seed(seed)
    q = torch.randint(0, 16, (rows, cols // 32, 32), generator=g).float()
    scale = (torch.rand(rows, cols // 32, 1, generator=g) * 0.01).half().float()
    low = (-torch.rand(rows, cols // 32, 1, generator=g) * 0.08).half().float()
    q[..., 0] = 0  # every block has its minimum and its maximum code, as the quantiser gives it
    q[..., 1] = 15
    return ((q * scale) + low).reshape(rows, cols)


def q8_matrix(rows: int, cols: int, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    q = torch.randint(-127, 128, (rows, cols // 32, 32), generator=g).float()
    q[..., 0] = 127
    scale = (torch.rand(rows, cols // 32, 1, generator=g) * 0.002).half().float()
    return (q * scale).reshape(rows, cols)


def bf16_matrix(rows: int, cols: int, seed: int = 0) -> torch.Tensor:
    """A bfloat16 checkpoint's matrix as it is served: upcast to float32 at load."""
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(rows, cols, generator=g) * 0.05).to(torch.bfloat16).float()


def f16_matrix(rows: int, cols: int, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(rows, cols, generator=g) * 0.05).half().float()


EVERY_KIND = [(q4_matrix, "q4"), (q8_matrix, "q8"), (bf16_matrix, "bf16"), (f16_matrix, "f16")]
MAKERS = [make for make, _ in EVERY_KIND]


def test_the_kernel_builds_for_this_cpus_widest_vectors():
    from engine.placement import cpu_flags

    flags = cpu_flags()
    widest = "avx512" if "avx512f" in flags else ("avx2" if {"avx2", "fma"} <= flags else "scalar")
    assert kernels().isa() == widest, (kernels().isa(), widest)


@pytest.mark.parametrize("make, kind", EVERY_KIND)
def test_a_matrix_on_a_grid_is_found_and_decodes_to_the_same_bits(make, kind):
    weight = make(96, 160)
    grid = pack(weight)
    assert grid is not None and grid.kind == kind
    assert torch.equal(grid.decoded(), weight)
    # A fifth of the bytes or less (q4), a quarter and a bit (q8), half (a half).
    share = {"q4": 0.2, "q8": 0.3, "bf16": 0.5, "f16": 0.5}[kind]
    assert grid.nbytes <= weight.numel() * weight.element_size() * share


def test_a_matrix_off_every_grid_keeps_its_float32_product():
    assert pack(torch.randn(64, 128)) is None
    half = bf16_matrix(64, 128)
    half[7, 9] = torch.nextafter(half[7, 9], torch.tensor(1.0))  # a float32 between two bfloat16s
    assert pack(half) is None
    near = q4_matrix(64, 128)
    near[3, 5] = torch.nextafter(near[3, 5], torch.tensor(1.0))  # one weight one bit off the grid
    assert pack(near) is None
    assert pack(torch.randn(64, 100)) is None  # inputs not a whole number of blocks
    assert pack(q4_matrix(200, 128)) is None  # outputs not a whole number of lane groups (16)


def test_packed_grids_are_stored_under_their_weights_and_read_back_the_same(tmp_path):
    matrices = {"a": q4_matrix(32, 64), "b": q8_matrix(16, 64, seed=1), "h": bf16_matrix(16, 64, seed=2)}
    first, off = grid_store.packed(matrices, tmp_path)
    [stored] = tmp_path.glob("*.safetensors")
    written = stored.stat().st_mtime_ns
    again, _ = grid_store.packed(matrices, tmp_path)
    assert off is None and stored.stat().st_mtime_ns == written  # read back, not packed and written again
    for name, matrix in matrices.items():
        assert again[name].kind == first[name].kind and again[name].shape == first[name].shape
        assert torch.equal(again[name].decoded(), matrix)
    # Other weights are another entry; weights off every grid store nothing.
    other = dict(matrices, a=q4_matrix(32, 64, seed=2))
    assert grid_store.packed(other, tmp_path)[0] is not None and len(list(tmp_path.glob("*.safetensors"))) == 2
    grids, off = grid_store.packed({"a": matrices["a"], "c": torch.randn(16, 64)}, tmp_path)
    assert grids is None and off == "c" and len(list(tmp_path.glob("*.safetensors"))) == 2
    # Halves alone pack in a moment: found, and not kept on disk.
    halves, off = grid_store.packed({"h": matrices["h"]}, tmp_path)
    assert off is None and halves["h"].kind == "bf16" and len(list(tmp_path.glob("*.safetensors"))) == 2


@pytest.mark.parametrize("make", MAKERS)
def test_the_product_is_the_float32_product_and_each_row_is_the_same_in_any_pass(make):
    weight = make(208, 576, seed=3)
    grid = pack(weight)
    x = torch.randn(2 * PANEL_FROM + 9, 576, generator=torch.Generator().manual_seed(1))
    whole = grid(x)
    reference = F.linear(x, weight)
    assert torch.allclose(whole, reference, rtol=1e-5, atol=1e-5)
    alone = torch.cat([grid(x[i:i + 1]) for i in range(x.shape[0])])
    # Every row count on both sides of the panel path, and rows at every offset: the same bits.
    assert torch.equal(whole, alone)
    for rows in range(1, x.shape[0]):
        for start in (0, 1, 5):
            if start + rows <= x.shape[0]:
                assert torch.equal(grid(x[start:start + rows]), alone[start:start + rows]), (rows, start)


@pytest.mark.parametrize("make", MAKERS)
@pytest.mark.parametrize("rows", [1, 3, PANEL_FROM + 4])
def test_every_weight_the_kernel_multiplies_is_the_float32_weight_bit_for_bit(make, rows):
    """Rows of the identity pick single weights out of the product (0 * w adds exactly nothing), so
    the kernel's decoded weights, on every path and row count, must be the matrix's own bits."""
    weight = make(208, 64, seed=4)
    grid = pack(weight)
    eye = torch.eye(64)
    picked = torch.cat([grid(eye[i:i + rows]) for i in range(0, 64, rows)])[:64]
    assert torch.equal(picked, weight.T.contiguous())


@pytest.mark.parametrize("make", [q4_matrix, bf16_matrix])
def test_the_thread_count_does_not_change_a_bit(make):
    grid = pack(make(256, 576, seed=5))
    x = torch.randn(20, 576)
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = grid(x)
        torch.set_num_threads(2)
        two = grid(x)
    finally:
        torch.set_num_threads(before)
    assert torch.equal(one, two)


def test_a_workers_settings_say_where_its_engine_keeps_the_packed_grids(grid_tiny, tmp_path):
    """BRIGADE_GRID_DIR reaches the engine through the settings and the engine's config, not the
    environment (only the settings module reads it)."""
    from engine import Engine
    from ops.core.settings import Settings
    from workers.engine_loading import engine_config

    folder = tmp_path / "grids"
    config = engine_config(Settings(model=str(grid_tiny), grid_dir=str(folder), torch_threads=1))
    assert Engine.load(config).runner.primary.storage == "grid"
    assert len(list(folder.glob("*.safetensors"))) == 1


def test_grid_weights_have_row_quantum_one():
    """engine/batch_invariance.py measures the kernel rather than assuming it: no padding needed."""

    class Copy:  # the shape of engine.model_runner.Weights that row_quantum reads
        def __init__(self):
            layer = type("Layer", (), {})()
            layer.qkv, layer.o = pack(q4_matrix(96, 64)), pack(q4_matrix(64, 64, 1))
            layer.gate_up, layer.down = pack(q4_matrix(256, 64, 2)), pack(q4_matrix(64, 128, 3))
            self.layers = [layer]
            self.output = pack(q8_matrix(2048, 64))
            self.dtype = torch.float32

    copy = Copy()
    assert all(isinstance(m, GridMatrix) for m in (copy.layers[0].qkv, copy.output))
    assert row_quantum(copy) == 1


def test_a_model_on_grids_is_read_from_them_and_answers_as_hugging_face_float32(grid_tiny):
    from engine import Engine, EngineConfig, EngineRequest, SamplingParams
    from engine.checkpoint import transformers_model

    engine = Engine.load(EngineConfig(model=str(grid_tiny), torch_threads=1, max_wait_ms=0))
    assert engine.runner.primary.storage == "grid" and engine.runner.primary.quantum == 1
    model = transformers_model(grid_tiny, torch.float32, torch.device("cpu"))
    prompts = ["Hello there", "The capital of France is", "1 2 3 4"]
    requests = [EngineRequest(f"p{i}", SamplingParams(max_tokens=12, ignore_eos=True), prompt=p)
                for i, p in enumerate(prompts)]
    done = engine.generate(requests)
    for r in requests:
        ids = torch.tensor([engine.encode(r)])
        with torch.inference_mode():
            reference = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False,
                                       max_new_tokens=12, min_new_tokens=12)[0, ids.shape[1]:]
        assert done[r.request_id].token_ids == reference.tolist(), r.prompt


def test_without_a_compiler_the_engine_says_so_and_serves_the_same_answers_from_float32(grid_tiny, tmp_path):
    """A machine without g++: one warning naming what to install, ordinary float32 products."""
    import os
    import subprocess
    import sys

    script = (
        "import logging, sys\n"
        "logging.basicConfig(level=logging.INFO, stream=sys.stdout)\n"
        "from engine import Engine, EngineConfig, EngineRequest, SamplingParams\n"
        f"e = Engine.load(EngineConfig(model={str(grid_tiny)!r}, torch_threads=1, max_wait_ms=0,\n"
        f"                             kernel_dir={str(tmp_path / 'kernels')!r}))\n"
        "print('storage', e.runner.primary.storage)\n"
        "r = EngineRequest('a', SamplingParams(max_tokens=4, ignore_eos=True), prompt='Hello there')\n"
        "print('tokens', e.generate([r])['a'].token_ids)\n"
    )
    env = dict(os.environ, CXX="/bin/false")
    proc = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300,
                          cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "event=kernels_unavailable" in proc.stdout + proc.stderr
    assert "apt-get install g++" in proc.stdout + proc.stderr
    assert "storage float32" in proc.stdout
    # The same answer the kernels give (and Hugging Face float32: the test above).
    from engine import Engine, EngineConfig, EngineRequest, SamplingParams

    with_kernels = Engine.load(EngineConfig(model=str(grid_tiny), torch_threads=1, max_wait_ms=0))
    request = EngineRequest("a", SamplingParams(max_tokens=4, ignore_eos=True), prompt="Hello there")
    assert f"tokens {with_kernels.generate([request])['a'].token_ids}" in proc.stdout
