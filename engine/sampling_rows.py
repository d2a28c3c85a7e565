"""Which rows of a step's logits take a token: one per decoding sequence, the first of a drafted
chunk's (the rest verify its draft), none of a prompt chunk that does not end its prompt; a scored
prompt's every position scored on the way; and at a request's first token, its further choices
forked from its row (engine/choices.py). Pure but for the fork, which the engine does."""
from __future__ import annotations

from typing import Callable

import torch

from engine.logprobs import TokenTexts, score_prompts
from engine.sequence import Chunk, Sequence


def sampling_rows(chunks: list[Chunk], logits: torch.Tensor, token_texts: TokenTexts,
                  fork: Callable[[Sequence], list[Sequence]]
                  ) -> tuple[list[Sequence], torch.Tensor, dict[Sequence, tuple[Chunk, torch.Tensor]]]:
    """The sequences that take a token this step and their rows of `logits`, and each drafted
    chunk with its positions' logits (verified once its first token is sampled). `fork(seq)` makes
    a request's further choices at its first token and returns those that run now (each samples
    from its parent's row)."""
    sampled, rows, scored, at = [], [], [], 0
    drafted: dict[Sequence, tuple[Chunk, torch.Tensor]] = {}
    for c in chunks:
        if c.every_position:
            scored.append((c, at))
            at += c.length
        elif c.draft:  # its first row samples as any decode row; the others verify the draft
            drafted[c.seq] = (c, logits[at:at + c.length])
            sampled.append(c.seq)
            rows.append(at)
            at += c.length
            continue
        elif c.samples:
            at += 1
        if c.samples and not c.seq.scores_only:
            sampled.append(c.seq)
            rows.append(at - 1)
    if scored:
        score_prompts(scored, logits, token_texts)
    for seq, row in list(zip(sampled, rows)):
        if seq.params.n == 1 or seq.output_ids:
            continue  # forks happen at a request's first token only
        for child in fork(seq):
            sampled.append(child)
            rows.append(row)
    if rows == list(range(logits.shape[0])):
        return sampled, logits, drafted  # the plain case: one row per sampled sequence, in order
    return sampled, logits[rows], drafted
