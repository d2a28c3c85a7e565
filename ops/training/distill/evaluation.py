"""How close a model is to its teacher on held-out answers: perplexity of the teacher's answers
and greedy agreement (the benchmarks that need the engine's speed and the quality questions are
in ops/bench/distill.py)."""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from ops.training.distill.corpus import Example
from ops.training.distill.trainer import answer_batch, answer_logits, usable

AGREEMENT_TOKENS = 32  # an answer agrees with the teacher's when its first 32 tokens are the same


def perplexity(model, examples: list[Example], pad_id: int, batch_size: int = 8) -> dict:
    """exp(mean negative log-likelihood per answer token), at temperature 1."""
    model = model.eval()
    device = next(model.parameters()).device
    nll, tokens = 0.0, 0
    examples = usable(examples)
    with torch.no_grad():
        for i in range(0, len(examples), batch_size):
            batch = answer_batch(examples[i:i + batch_size], pad_id, device)
            logits = answer_logits(model, batch).float()
            nll += float(F.cross_entropy(logits, batch["labels"], reduction="sum"))
            tokens += int(batch["labels"].numel())
    mean = nll / max(1, tokens)
    return {"perplexity": round(math.exp(mean), 4), "nll_per_token": round(mean, 5), "tokens": tokens,
            "answers": len(examples)}


def agreement(answers: dict[str, list[int]], reference: dict[str, list[int]], tokens: int = AGREEMENT_TOKENS) -> dict:
    """Share of prompts whose first `tokens` greedy tokens equal the reference's (a shorter answer
    agrees only when it is the reference's whole answer)."""
    same = sum(answers[k][:tokens] == reference[k][:tokens] for k in reference)
    return {"identical": same, "of": len(reference), "share": round(same / max(1, len(reference)), 4),
            "tokens": tokens}


def gap_closed(untrained: float, trained: float, teacher: float) -> float | None:
    """Share of the untrained student's distance to the teacher that training removed."""
    gap = untrained - teacher
    return None if gap <= 0 else round((untrained - trained) / gap, 4)
