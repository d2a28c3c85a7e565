"""How many rows a pass must have so that each row's numbers do not depend on the others.

A matrix library picks its kernel by the shape of the product. Measured here (torch 2.13's MKL
on an AVX2 CPU, fp32): a one-row product is a matrix-vector kernel, and products of two or three
rows, or the last rows of a product whose row count is not a multiple of four, go through
remainder kernels; each sums in its own order, so one token's logits differ in their last bits by
how many tokens share its pass. In greedy decoding of a small model such bits flip a token now
and then, and the answer goes another way from there: the same question answered differently
alone, beside fifteen others, after a prefix-cache hit or in chunks. bf16 products on that CPU
compute each row alone (the same bits for any row count).

`row_quantum` finds, once per copy of the weights, the smallest q (1, 2, 4, 8, 16, 32 or 64) for
which every row of a product of any multiple of q rows equals that row computed in a product of
q rows, on the copy's own matrices; the runner pads each pass's rows to a multiple of q (rows
that go through the matrix products and no attention). That is the property this file checks,
on this machine's kernels, rather than assumes: another CPU, library version or a GPU gets its
own q, or none (`None`: no padding helps; logged, and the engine runs unpadded).
"""
from __future__ import annotations

import logging

import torch

from engine.grid_linear import GridMatrix, matmul

log = logging.getLogger("brigade.engine")
QUANTA = (1, 2, 4, 8, 16, 32, 64)
# Row counts a pass may have, tried for each quantum: small ones (where kernels change), the
# scheduler's usual batch widths, and a long prefill.
_PROBE_MULTIPLES = (1, 2, 3, 5, 8, 17)


def padded(rows: int, quantum: int) -> int:
    return -(-rows // quantum) * quantum if quantum > 1 else rows


def _matrices(weights) -> list:
    layer = weights.layers[0]
    # The head last: the largest product and the one that decides tokens. Its first 1,024 rows
    # stand for it (the kernel is chosen by rows and the inner size, not by the output width).
    head = weights.output
    return [layer.qkv, layer.o, layer.gate_up, layer.down, head.top(1024) if isinstance(head, GridMatrix) else head[:1024]]


def invariant_at(weights, quantum: int, max_rows: int = 64 * 17) -> bool:
    generator = torch.Generator(device="cpu").manual_seed(1234)
    for matrix in _matrices(weights):
        inner = matrix.shape[1]
        largest = min(quantum * _PROBE_MULTIPLES[-1], max_rows)
        x = torch.randn(largest, inner, generator=generator)
        if not isinstance(matrix, GridMatrix):
            x = x.to(device=matrix.device, dtype=matrix.dtype)
        with torch.inference_mode():
            alone = torch.cat([matmul(x[i:i + quantum], matrix) for i in range(0, largest, quantum)])
            for k in _PROBE_MULTIPLES:
                rows = quantum * k
                if rows > largest:
                    break
                if not torch.equal(matmul(x[:rows], matrix), alone[:rows]):
                    return False
            # A row's neighbours differ from pass to pass: its bits must not depend on its place.
            for shift in {1, quantum - 1} - {0}:
                rows = min(quantum * 4, largest - shift)
                if not torch.equal(matmul(x[shift:shift + rows], matrix), alone[shift:shift + rows]):
                    return False
    return True


def row_quantum(weights) -> int:
    """The smallest row multiple that makes this copy's products batch-invariant; 1 when no
    quantum up to 64 does (the engine then runs unpadded, and says so in its log)."""
    for quantum in QUANTA:
        if invariant_at(weights, quantum):
            log.info("event=batch_invariant dtype=%s row_quantum=%d", str(weights.dtype).removeprefix("torch."), quantum)
            return quantum
    log.warning("event=not_batch_invariant dtype=%s: no row quantum up to %d gives every row the same bits; "
                "greedy answers may depend on what shares their passes", weights.dtype, QUANTA[-1])
    return 1
