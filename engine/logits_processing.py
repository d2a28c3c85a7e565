"""What a request's settings do to its row of logits before a token is chosen.

Applied in vLLM's order, in place, on a copy of the rows that need it (the raw logits stay as
they were: raw logprobs and the plain rows' one argmax read them): repetition penalty (Hugging
Face's rule, over prompt and output), presence and frequency penalties (OpenAI's rule, over the
output only), logit bias, then min_tokens' masks. Temperature, min_p, top-k and top-p belong to
choosing a token (engine/sampling.py); a guide's mask is the engine's (engine/guided.py).
"""
from __future__ import annotations

import torch

from engine.sequence import Sequence


def apply_repetition_penalty(logits: torch.Tensor, seen: list[int], penalty: float) -> torch.Tensor:
    # Same rule as Hugging Face: shrink the score of every token already present.
    if penalty == 1.0 or not seen:
        return logits
    ids = torch.tensor(sorted(set(seen)), dtype=torch.long)
    scores = logits[ids]
    logits[ids] = torch.where(scores < 0, scores * penalty, scores / penalty)
    return logits


def apply_presence_frequency(logits: torch.Tensor, generated: list[int], presence: float,
                             frequency: float) -> torch.Tensor:
    """OpenAI's rule: logit[t] -= presence * (count[t] > 0) + frequency * count[t]."""
    if not generated or (presence == 0.0 and frequency == 0.0):
        return logits
    ids, counts = torch.tensor(generated, dtype=torch.long).unique(return_counts=True)
    logits[ids] -= presence + frequency * counts.to(logits.dtype)
    return logits


def apply_logit_bias(logits: torch.Tensor, bias: tuple[tuple[int, float], ...]) -> torch.Tensor:
    if bias:
        ids = torch.tensor([t for t, _ in bias], dtype=torch.long)
        logits.index_add_(0, ids, torch.tensor([b for _, b in bias], dtype=logits.dtype))
    return logits


def mask_early_stops(logits: torch.Tensor, seq: Sequence, eos_ids: set[int]) -> torch.Tensor:
    """Until min_tokens are generated, no token may end the answer (vLLM's rule)."""
    p = seq.params
    if len(seq.output_ids) < p.min_tokens:
        ends = sorted(set(p.stop_token_ids) | (set() if p.ignore_eos else eos_ids))
        if ends:
            logits[torch.tensor(ends, dtype=torch.long)] = float("-inf")
    return logits


def needs_processing(seq: Sequence) -> bool:
    """Whether seq's token is not simply the argmax of its raw logits."""
    return not seq.params.plain or len(seq.output_ids) < seq.params.min_tokens


def process(logits: torch.Tensor, seqs: list[Sequence], eos_ids: set[int]) -> torch.Tensor:
    """Every row of `logits` ([len(seqs), vocab], a copy) as seqs' settings make it, in place."""
    for row, seq in zip(logits, seqs):
        p = seq.params
        apply_repetition_penalty(row, seq.all_ids, p.repetition_penalty)
        apply_presence_frequency(row, seq.output_ids, p.presence_penalty, p.frequency_penalty)
        apply_logit_bias(row, p.logit_bias)
        mask_early_stops(row, seq, eos_ids)
    return logits
