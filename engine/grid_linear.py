"""float32 weights that lie on a grid, read from the grid: the same numbers, fewer bytes.

The default model ships as a GGUF file (Q4_1 for every linear layer, Q8_0 for the embedding and
the tied head) and is dequantised once to float32 (engine/model_files.py). Its float32 weights are
therefore exactly `scale * q + low` (Q4_1: a 4-bit code q and two numbers per block of 32 inputs)
and `scale * q` (Q8_0: a signed byte). A decode step on a CPU is bound by memory bandwidth, and
reading each weight as a 4-byte float moves 5.6x the bytes the grid needs. So at load each matrix
is checked for such a grid, recovered from its own float32 values and verified bit for bit
(`torch.equal` of the decoded matrix and the original). Most checkpoints people serve are stored
in bfloat16 or float16 and upcast to float32 at load: every such weight is a half, so such a
matrix is read as its 16-bit halves (half the bytes of float32). A matrix on none of these grids
(the tiny random test model, a float32 checkpoint) keeps the ordinary float32 product. Nothing is
rounded: a weight the kernel multiplies is the float32 weight Hugging Face `generate` multiplies.

The kernel (engine/csrc/grid_linear.cpp, compiled for this CPU on first use by engine/kernels.py)
sums each output in one fixed order, whatever the number of rows in
the pass, the row's place among them or the thread count, so its passes are batch-invariant by
construction (engine/batch_invariance.py finds row quantum 1 for them). Its order is not MKL's, so
a logit can differ from Hugging Face's in its last bits, as MKL's own kernels differ from each
other by row count; how often that changes a greedy answer is measured (`brigade bench quality`,
docs/architecture.md "Precision: measured").

`BRIGADE_GRID_WEIGHTS=false` turns it off (the plain float32 products, for comparison).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from engine.kernels import kernels

BLOCK = 32
# Passes of at least this many rows decode each group of weight rows once into a panel and reuse it
# for every row; fewer rows decode in registers. Both sum in the same order (the same bits).
PANEL_FROM = 12


LANES = 16  # weight rows per lane group in the kernel's layout (engine/csrc/grid_linear.cpp)


@dataclass
class GridMatrix:
    """A float32 matrix [out, in] stored as its grid, in the kernel's layout: rows in groups of 16,
    the group's 16 weights for one input side by side.

    q4: codes [out/16, in/2, 16] (input k in the low nibble, k+1 in the high one); q8: codes
    [out/16, in, 16] (signed bytes); scale and low [out/16, in/32, 16] float16 (GGUF's own, exact:
    a grid whose scale or low is not a float16 is not taken). bf16, f16: codes [out/16, in, 16],
    the weights themselves as bfloat16 or float16 (exact), no scale."""

    kind: str  # "q4", "q8", "bf16" or "f16"
    codes: torch.Tensor
    scale: torch.Tensor | None
    low: torch.Tensor | None
    shape: tuple[int, int]

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        k = kernels()
        rows = x.reshape(-1, x.shape[-1])
        if self.kind == "q4":
            out = k.q4_linear(rows, self.codes, self.scale, self.low, PANEL_FROM)
        elif self.kind == "q8":
            out = k.q8_linear(rows, self.codes, self.scale, PANEL_FROM)
        else:
            out = k.half_linear(rows, self.codes, PANEL_FROM)
        return out.view(*x.shape[:-1], self.shape[0])

    def decoded(self) -> torch.Tensor:
        """The float32 matrix, computed as the kernel computes each weight (for verification)."""
        n, k = self.shape
        if self.scale is None:
            return _unlaned(self.codes).float()
        scale = _unlaned(self.scale).float().repeat_interleave(BLOCK, dim=1)
        if self.kind == "q4":
            pairs = _unlaned(self.codes)
            q = torch.stack((pairs & 15, pairs >> 4), dim=-1).reshape(n, k).float()
            return (q * scale) + _unlaned(self.low).float().repeat_interleave(BLOCK, dim=1)
        return _unlaned(self.codes).view(torch.int8).float() * scale

    def top(self, rows: int) -> "GridMatrix":
        """Its first `rows` output rows, a multiple of 16 (a probe of the kernel on a smaller matrix)."""
        groups = min(rows, self.shape[0]) // LANES
        scale, low = (t[:groups] if t is not None else None for t in (self.scale, self.low))
        return GridMatrix(self.kind, self.codes[:groups], scale, low, (groups * LANES, self.shape[1]))

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (self.codes, self.scale, self.low) if t is not None)


def _laned(t: torch.Tensor) -> torch.Tensor:
    """[out, cols] -> [out/16, cols, 16]: each group of 16 rows side by side per column."""
    return t.reshape(t.shape[0] // LANES, LANES, t.shape[1]).transpose(1, 2).contiguous()


def _unlaned(t: torch.Tensor) -> torch.Tensor:
    return t.transpose(1, 2).reshape(t.shape[0] * LANES, t.shape[1])


def _half_neighbours(d: torch.Tensor, spread: int = 2) -> list[torch.Tensor]:
    """d rounded to float16, and the float16 values `spread` steps either side (as float32)."""
    base = d.to(torch.float16).view(torch.int16)
    return [(base + step).view(torch.float16).float() for step in (0, *[s for k in range(1, spread + 1) for s in (k, -k)])]


def _half_exact(t: torch.Tensor) -> bool:
    """Every value is a float16 (the kernel reads scales and lows as float16)."""
    return bool(torch.equal(t.half().float(), t))


def _first_exact(blocks: torch.Tensor, candidates: list[torch.Tensor], decode) -> tuple[torch.Tensor, torch.Tensor] | None:
    """Per block, the first candidate scale whose codes decode to the block exactly; None when a
    block has none. `decode(rows, scale)` gives the codes and decoded values of those block rows
    (None: all of them) under that scale.

    On a matrix that lies on the grid nearly every block takes the first candidate, so each later
    one is tried only on the blocks still open, and a matrix where the first fits fewer than half
    the blocks is taken as off the grid at once (the embedding, an 8-bit grid, was tried as a
    4-bit one with every candidate on every block: most of a worker's start, 10-30 s on one core).
    Giving up early only ever leaves a matrix to the ordinary float32 product."""
    flat = blocks.reshape(-1, blocks.shape[-1])
    open_rows: torch.Tensor | None = None  # None: every block, without copying them
    for scale in candidates:
        scale = scale.reshape(-1)
        rows_scale = scale if open_rows is None else scale[open_rows]
        q, values = decode(open_rows, rows_scale)
        wanted = flat if open_rows is None else flat[open_rows]
        exact = (values == wanted).all(dim=-1)
        if open_rows is None and exact.float().mean() < 0.5:
            return None
        if open_rows is None:  # every block at once; those still open are written over below
            chosen_scale, chosen_codes = rows_scale.clone(), q.to(torch.int16)
            open_rows = (~exact).nonzero().squeeze(1)
        else:
            chosen_scale[open_rows[exact]] = rows_scale[exact]
            chosen_codes[open_rows[exact]] = q[exact].to(torch.int16)
            open_rows = open_rows[~exact]
        if open_rows.numel() == 0:
            return chosen_scale.view(blocks.shape[:-1]), chosen_codes.view(blocks.shape)
    return None


def pack_q4(weight: torch.Tensor) -> GridMatrix | None:
    """The matrix as a 4-bit grid (Q4_1's: scale * q + low, q in 0..15), or None if it is not exactly one."""
    n, k = weight.shape
    if weight.dtype != torch.float32 or k % BLOCK or n % LANES:
        return None
    blocks = weight.detach().reshape(n, k // BLOCK, BLOCK)
    low = blocks.amin(dim=-1)
    top = blocks.amax(dim=-1)
    flat, flat_low = blocks.reshape(-1, BLOCK), low.reshape(-1)

    def decode(rows, scale):
        values = flat if rows is None else flat[rows]
        base = (flat_low if rows is None else flat_low[rows])[:, None]
        safe = torch.where(scale == 0, torch.ones_like(scale), scale)[:, None]
        q = torch.round((values - base) / safe).clamp_(0, 15)
        q = torch.where(scale[:, None] == 0, torch.zeros_like(q), q)
        return q, q * scale[:, None] + base

    found = _first_exact(blocks, _half_neighbours((top - low) / 15), decode)
    if found is None:
        return None
    scale, q = found
    if not (_half_exact(scale) and _half_exact(low)):
        return None
    q = q.to(torch.uint8).reshape(n, k)
    codes = q[:, 0::2] | (q[:, 1::2] << 4)
    return GridMatrix("q4", _laned(codes), _laned(scale.half()), _laned(low.half()), (n, k))


def pack_q8(weight: torch.Tensor) -> GridMatrix | None:
    """The matrix as an 8-bit grid (Q8_0's: scale * q, q in -128..127), or None if it is not exactly one."""
    n, k = weight.shape
    if weight.dtype != torch.float32 or k % BLOCK or n % LANES:
        return None
    blocks = weight.detach().reshape(n, k // BLOCK, BLOCK)
    amax = blocks.abs().amax(dim=-1)
    flat = blocks.reshape(-1, BLOCK)

    def decode(rows, scale):
        values = flat if rows is None else flat[rows]
        safe = torch.where(scale == 0, torch.ones_like(scale), scale)[:, None]
        q = torch.round(values / safe).clamp_(-128, 127)
        return q, q * scale[:, None]

    found = _first_exact(blocks, [amax / 127] + _half_neighbours(amax / 127), decode)
    if found is None:
        return None
    scale, q = found
    if not _half_exact(scale):
        return None
    codes = q.to(torch.int8).view(torch.uint8).reshape(n, k)
    return GridMatrix("q8", _laned(codes), _laned(scale.half()), None, (n, k))


HALVES = {"bf16": torch.bfloat16, "f16": torch.float16}


def pack_half(weight: torch.Tensor, kind: str) -> GridMatrix | None:
    """The matrix as its bfloat16 or float16 values, or None if one of them is not exactly a half."""
    n, k = weight.shape
    if weight.dtype != torch.float32 or k % BLOCK or n % LANES:
        return None
    half = weight.detach().to(HALVES[kind])
    if not torch.equal(half.float(), weight):
        return None
    return GridMatrix(kind, _laned(half), None, None, (n, k))


PACKERS = {"q4": pack_q4, "q8": pack_q8, "bf16": lambda w: pack_half(w, "bf16"), "f16": lambda w: pack_half(w, "f16")}


def pack(weight: torch.Tensor, kinds: tuple[str, ...] = ("q4", "q8", "bf16", "f16")) -> GridMatrix | None:
    """The first grid the matrix lies on exactly (verified by decoding it), or None. The block
    grids come first: a matrix on one takes a quarter of the bytes of its halves, or less."""
    for kind in kinds:
        grid = PACKERS[kind](weight)
        if grid is not None and torch.equal(grid.decoded(), weight):
            return grid
    return None


def matmul(x: torch.Tensor, matrix, bias: torch.Tensor | None = None) -> torch.Tensor:
    """x @ matrix.T (+ bias) for a plain tensor (F.linear, bias fused) or a GridMatrix."""
    if isinstance(matrix, GridMatrix):
        return matrix(x) if bias is None else matrix(x) + bias
    return torch.nn.functional.linear(x, matrix, bias)


def snap_q4(weight: torch.Tensor) -> torch.Tensor:
    """The float32 matrix GGUF's Q4_1 would leave once dequantised: per block of 32 inputs a
    float16 scale and low, codes 0..15, (scale * q) + low (how `pack_q4` finds it again)."""
    b = weight.detach().float().reshape(weight.shape[0], -1, BLOCK)
    low, top = b.amin(-1, keepdim=True), b.amax(-1, keepdim=True)
    scale = ((top - low) / 15).half().float()
    low = low.half().float()
    q = torch.round((b - low) / torch.where(scale == 0, 1.0, scale)).clamp(0, 15)
    return ((q * scale) + low).reshape(weight.shape)


def snap_q8(weight: torch.Tensor) -> torch.Tensor:
    """The float32 matrix GGUF's Q8_0 would leave: a float16 scale per block, codes -127..127."""
    b = weight.detach().float().reshape(weight.shape[0], -1, BLOCK)
    scale = (b.abs().amax(-1, keepdim=True) / 127).half().float()
    # A zero block (a padding token's row) has scale 0 and codes 0.
    return (torch.round(b / torch.where(scale == 0, 1.0, scale)).clamp(-127, 127) * scale).reshape(weight.shape)


@torch.no_grad()
def snap_model(model) -> None:
    """Put a model's matrices on GGUF's grids in place, as a Q4_1 file dequantised leaves them:
    every linear layer on a 4-bit grid, the embedding and head on an 8-bit one. Its weights are
    then read from the grids (`pack`), exactly: the snapped model is what is served. Used for a
    distilled student (`brigade distill`, unless `--float32-student`), whose trained weights lie on
    no grid."""
    head = model.get_output_embeddings().weight
    for module in model.modules():
        if isinstance(module, torch.nn.Linear) and module.weight is not head:
            module.weight.copy_(snap_q4(module.weight))
    embedding = model.get_input_embeddings().weight
    embedding.copy_(snap_q8(embedding))
    if head.data_ptr() != embedding.data_ptr():  # untied
        head.copy_(snap_q8(head))
