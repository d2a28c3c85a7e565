"""Deterministic attention in one kernel call (engine/csrc/attention.cpp): each query over exactly
the keys it sees, the same bits however its prompt was cut and whatever shares the pass, the same
attention as SDPA's up to float32 rounding, and 16 keys at a time (AVX-512) the bits of one key at
a time (`attend_key_by_key`, the order that defines them)."""
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


def test_sixteen_keys_at_a_time_give_the_bits_of_one_key_at_a_time():
    """Every head size and group the blocked path takes (and one it leaves to the other), blocks cut
    anywhere (a key count of 1, 15, 16, 17, ...), a chunk's rows taken 4 at a time (15, 17, 40 and
    5 rows: a last tile of 1-3), decode rows beside prefill chunks, and scores peaked enough that
    exp underflows."""
    k = kernels()
    for d, kv_heads, group in ((64, 3, 3), (32, 1, 4), (128, 2, 1), (16, 2, 3), (48, 2, 2)):
        for scale_up in (0.1, 1.0, 40.0, 400.0):
            g = torch.Generator().manual_seed(d * 1000 + int(scale_up * 10))
            lengths = [1, 15, 16, 17, 40, 5]
            starts = [0, 0, 3, 16, 0, 57]
            caches = [torch.randn(2, kv_heads, 70, 2 * d, generator=g) for _ in lengths]
            rows = sum(lengths)
            q = torch.randn(rows, kv_heads * group, d, generator=g) * scale_up
            new = torch.randn(rows, kv_heads, 2 * d, generator=g)
            args = (q, new, None, starts, lengths, 1, d ** -0.5, group)
            fast = k.attend(*args[:2], [c.clone() for c in caches], *args[3:])
            one_by_one = k.attend_key_by_key(*args[:2], [c.clone() for c in caches], *args[3:])
            assert torch.equal(fast, one_by_one), (d, group, scale_up)


def test_exp_has_glibcs_bits_where_it_underflows_and_everywhere_between():
    """Each of 16 keys per sequence scores a chosen s (key 0 scores 0, the top), and its value
    carries exp(s) alone into one output column, scaled so a one-ulp (or one-subnormal) change shows:
    glibc's expf (one key at a time) and the blocked path's own must agree on every s, from 0 down
    past where exp(s) leaves the normal floats (-87.3), reaches the least subnormal (-103.28) and 0
    (-103.97)."""
    k = kernels()
    d, top_scale = 64, 8.0  # q = 8 e_0 and scale 1/8: a key k scores exactly k[0]
    wanted = torch.cat([torch.linspace(-110.0, 0.0, 1100), torch.tensor(
        [-103.9721, -103.9720, -103.2790, -103.2789, -88.0, -87.34, -87.33, -0.0, -1e-30, -1e-7])])
    wanted = torch.cat([wanted, torch.zeros((-len(wanted)) % 16)])
    chunks = len(wanted) // 16
    q = torch.zeros(chunks, 1, d)
    q[:, 0, 0] = top_scale
    new = torch.zeros(chunks, 1, 2 * d)
    caches, starts = [], []
    for c in range(chunks):
        cache_c = torch.zeros(1, 1, 18, 2 * d)
        keys = torch.zeros(17, 2 * d)
        keys[1:, 0] = wanted[16 * c:16 * c + 16]  # key 0 scores 0: the top
        keys[1:, d + 1 + torch.arange(16)] = torch.eye(16) * 3e38  # value column 1 + j carries exp(s_j)
        cache_c[0, 0, :17] = keys
        caches.append(cache_c)
        starts.append(17)
    args = (q, new, None, starts, [1] * chunks, 0, 1.0 / top_scale, 1)
    fast = k.attend(q, new, [c.clone() for c in caches], *args[3:])
    one_by_one = k.attend_key_by_key(q, new, [c.clone() for c in caches], *args[3:])
    assert torch.equal(fast, one_by_one)
    carried = one_by_one[:, 1:17].reshape(-1)
    assert (carried[wanted < -103.98] == 0).all() and (carried[(wanted > -103.97) & (wanted < -103.28)] > 0).all()
