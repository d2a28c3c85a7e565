"""Deterministic attention in one kernel call (engine/csrc/attention.cpp): each query over exactly
the keys it sees, the same bits however its prompt was cut and whatever shares the pass, and the
same attention as SDPA's up to float32 rounding."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from engine.kernels import kernels

LAYERS, KV_HEADS, GROUP, D = 2, 3, 3, 64
HEADS = KV_HEADS * GROUP
SCALE = D ** -0.5


def cache(capacity: int = 256) -> torch.Tensor:
    return torch.zeros(LAYERS, KV_HEADS, capacity, 2 * D)


def attend(chunks: list[tuple[torch.Tensor, int, torch.Tensor, torch.Tensor]], layer: int = 1) -> torch.Tensor:
    """chunks: (cache, start, q [n, heads, d], new_kv [n, kv_heads, 2d]) in pass order."""
    q = torch.cat([c[2] for c in chunks])
    new = torch.cat([c[3] for c in chunks])
    return kernels().attend(q, new, [c[0] for c in chunks], [c[1] for c in chunks], [len(c[2]) for c in chunks],
                            layer, SCALE, GROUP)


def sequence(n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, HEADS, D, generator=g), torch.randn(n, KV_HEADS, 2 * D, generator=g)


def test_it_is_sdpa_with_a_causal_mask_up_to_rounding():
    q, new = sequence(20, 0)
    kv = cache()
    out = attend([(kv, 0, q, new)])
    keys, values = new[:, :, :D].transpose(0, 1), new[:, :, D:].transpose(0, 1)  # [kv_heads, n, d]
    reference = F.scaled_dot_product_attention(
        q.transpose(0, 1), keys.repeat_interleave(GROUP, 0), values.repeat_interleave(GROUP, 0), is_causal=True,
        scale=SCALE).transpose(0, 1).reshape(20, HEADS * D)
    assert torch.allclose(out, reference, atol=1e-5, rtol=1e-5)
    # Its keys and values are in the cache's layer, at their positions.
    assert torch.equal(kv[1, :, :20], new.transpose(0, 1)) and not kv[0].any()


def test_a_query_has_the_same_bits_however_its_prompt_was_cut_and_whatever_shares_the_pass():
    q, new = sequence(37, 1)
    whole = attend([(cache(), 0, q, new)])
    # In chunks of 5 (chunked prefill, a prefix hit, a resumed prefill), then one at a time (decode).
    kv = cache()
    pieces = [attend([(kv, s, q[s:s + 5], new[s:s + 5])]) for s in range(0, 30, 5)]
    pieces += [attend([(kv, s, q[s:s + 1], new[s:s + 1])]) for s in range(30, 37)]
    assert torch.equal(torch.cat(pieces), whole)
    # Beside other sequences' chunks, before and after it in the pass.
    other_q, other_new = sequence(9, 2)
    third_q, third_new = sequence(4, 3)
    kv = cache()
    together = attend([(cache(), 0, other_q, other_new), (kv, 0, q, new), (cache(), 0, third_q, third_new)])
    assert torch.equal(together[9:9 + 37], whole)


def test_the_thread_count_does_not_change_a_bit():
    q, new = sequence(64, 4)
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = attend([(cache(), 0, q, new)])
        torch.set_num_threads(2)
        two = attend([(cache(), 0, q, new)])
    finally:
        torch.set_num_threads(before)
    assert torch.equal(one, two)
