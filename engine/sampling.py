"""Turning logits into tokens, per request.

Each sampled token draws its randomness from a generator seeded with (request seed, token index),
not from a stream that advances with every call: token n is the same whether the request ran
alone, in a batch, or was resumed at token n on another worker.
"""
from __future__ import annotations

import torch

from engine.sequence import Sequence

_MASK64 = (1 << 64) - 1


def token_seed(seed: int, index: int) -> int:
    """A well-mixed 63-bit seed for token `index` of a request (splitmix64 finaliser)."""
    z = (seed * 0x9E3779B97F4A7C15 + (index + 1) * 0xBF58476D1CE4E5B9) & _MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
    return (z ^ (z >> 31)) & ((1 << 63) - 1)


def apply_repetition_penalty(logits: torch.Tensor, seen: list[int], penalty: float) -> torch.Tensor:
    # Same rule as Hugging Face: shrink the score of every token already present.
    if penalty == 1.0 or not seen:
        return logits
    ids = torch.tensor(sorted(set(seen)), dtype=torch.long)
    scores = logits[ids]
    logits[ids] = torch.where(scores < 0, scores * penalty, scores / penalty)
    return logits


def filter_top_k_top_p(logits: torch.Tensor, top_k: int, top_p: float) -> torch.Tensor:
    if top_k > 0 and top_k < logits.shape[-1]:
        kth = torch.topk(logits, top_k).values[-1]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p < 1.0:
        sorted_logits, order = torch.sort(logits, descending=True)
        cumulative = torch.softmax(sorted_logits, dim=-1).cumsum(dim=-1)
        # Drop a token once the tokens before it already cover top_p; always keep the best one.
        drop = cumulative - torch.softmax(sorted_logits, dim=-1) >= top_p
        drop[0] = False
        logits = logits.masked_fill(torch.zeros_like(drop).scatter(0, order, drop), float("-inf"))
    return logits


def sample(logits: torch.Tensor, seqs: list[Sequence]) -> list[int]:
    """One token per row of `logits` (float32, [len(seqs), vocab])."""
    # One argmax for the whole batch covers the common case (plain greedy rows).
    tokens: list[int] = logits.argmax(dim=-1).tolist()
    for i, (row, seq) in enumerate(zip(logits, seqs)):
        p = seq.params
        if p.greedy and p.repetition_penalty == 1.0:
            continue
        if p.repetition_penalty != 1.0:
            row = apply_repetition_penalty(row.clone(), seq.all_ids, p.repetition_penalty)
        if p.greedy:
            tokens[i] = int(torch.argmax(row))
            continue
        row = filter_top_k_top_p(row / p.temperature, p.top_k, p.top_p)
        probs = torch.softmax(row, dim=-1)
        gen = torch.Generator().manual_seed(token_seed(seq.seed, len(seq.output_ids)))
        tokens[i] = int(torch.multinomial(probs, 1, generator=gen))
    return tokens
