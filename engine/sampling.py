"""Choosing each row's token from its logits.

Plain greedy rows (engine/sequence.SamplingParams.plain) take the one argmax of the whole batch.
The others get a copy of their row processed by their settings (engine/logits_processing.py, and
a guide's mask), then the argmax, or a draw after temperature, min_p, top-k and top-p.

Each sampled token draws its randomness from a generator seeded with (choice's seed, token
index), not from a stream that advances with every call: token n is the same whether the request
ran alone, in a batch, or was resumed at token n on another worker. Choice 0 of a request uses its
seed; choice i > 0 one derived from (seed, i), so that each choice is reproducible on its own.
"""
from __future__ import annotations

import torch

from engine.logits_processing import needs_processing, process
from engine.sequence import Sequence

_MASK64 = (1 << 64) - 1


def _mix(z: int) -> int:
    """splitmix64's finaliser, to 63 bits."""
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
    return (z ^ (z >> 31)) & ((1 << 63) - 1)


def token_seed(seed: int, index: int) -> int:
    """A well-mixed 63-bit seed for token `index` of a request (splitmix64 finaliser)."""
    return _mix((seed * 0x9E3779B97F4A7C15 + (index + 1) * 0xBF58476D1CE4E5B9) & _MASK64)


def choice_seed(seed: int, choice: int) -> int:
    """The seed of answer `choice` of a request seeded `seed` (n > 1): the request's own for
    choice 0, so that n=1 answers are unchanged."""
    if choice == 0:
        return seed
    return _mix((seed * 0xD6E8FEB86659FD93 + choice * 0x9E3779B97F4A7C15) & _MASK64)


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


def filter_min_p(logits: torch.Tensor, min_p: float) -> torch.Tensor:
    """Drop tokens whose probability is below min_p times the best token's (vLLM's min_p)."""
    if min_p <= 0.0:
        return logits
    probs = torch.softmax(logits, dim=-1)
    return logits.masked_fill(probs < min_p * probs.max(), float("-inf"))


def choose(row: torch.Tensor, seq: Sequence, ahead: int = 0) -> int:
    """seq's next token from its processed row of logits; `ahead` > 0: the token `ahead` places
    after it (a drafted position's, engine/speculation.py), drawn from that token's own seed."""
    p = seq.params
    if p.greedy:
        return int(torch.argmax(row))
    row = filter_top_k_top_p(filter_min_p(row / p.temperature, p.min_p), p.top_k, p.top_p)
    probs = torch.softmax(row, dim=-1)
    gen = torch.Generator().manual_seed(token_seed(seq.seed, len(seq.output_ids) + ahead))
    return int(torch.multinomial(probs, 1, generator=gen))


def sample(logits: torch.Tensor, seqs: list[Sequence], eos_ids: set[int] = frozenset(), guides=None) -> list[int]:
    """One token per row of `logits` (float32, [len(seqs), vocab], left unchanged). `guides`
    (engine/guided.Guides) masks the rows of guided sequences (those with a matcher)."""
    # One argmax for the whole batch covers the common case (plain greedy rows).
    tokens: list[int] = logits.argmax(dim=-1).tolist()
    rows = [i for i, seq in enumerate(seqs) if needs_processing(seq) or not seq.params.greedy]
    if not rows:
        return tokens
    chosen = [seqs[i] for i in rows]
    work = process(logits[rows], chosen, eos_ids)  # indexing with a list copies: the raw rows stay
    guided = [j for j, seq in enumerate(chosen) if seq.matcher is not None]
    if guided:
        guides.mask(work, guided, [chosen[j].matcher for j in guided])
    # Greedy processed rows (penalties, bias, a guide...) share one argmax over the processed rows;
    # only sampled rows are chosen one by one (each draws from its own seeded generator).
    best = work.argmax(dim=-1).tolist()
    for j, i in enumerate(rows):
        tokens[i] = best[j] if chosen[j].params.greedy else choose(work[j], chosen[j])
    return tokens
