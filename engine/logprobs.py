"""Logprobs as the OpenAI API and vLLM report them: a token's, and its best alternatives'.

RAW logprobs (vLLM v1's default): log_softmax of the model's float32 logits before any processing
(temperature, penalties, bias, masks). Gathered in one log_softmax and one topk over every row
that asks, whether the rows are sampled tokens or a scored prompt's positions.

Shape of one entry: {"token": text, "id": id, "logprob": float, "top": [[text, logprob, id], ...]}, the top
ones best first; a token's text is that token decoded alone.
"""
from __future__ import annotations

import torch

from engine.sequence import Chunk, Sequence


class TokenTexts:
    """Each token's text decoded alone, remembered (a vocabulary's worth at most)."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self.texts: dict[int, str] = {}

    def __getitem__(self, token_id: int) -> str:
        text = self.texts.get(token_id)
        if text is None:
            text = self.texts[token_id] = self.tokenizer.decode([token_id])
        return text


def entries(logits: torch.Tensor, targets: list[int], tops: list[int], texts: TokenTexts) -> list[dict]:
    """One entry per row of `logits` ([rows, vocab], raw): the logprob of that row's target
    token and its `tops[row]` best alternatives."""
    if not targets:
        return []
    logprobs = torch.log_softmax(logits.float(), dim=-1)
    chosen = logprobs.gather(1, torch.tensor(targets, dtype=torch.long)[:, None])[:, 0].tolist()
    k = min(max(tops), logprobs.shape[-1])
    best_values, best_ids = logprobs.topk(k, dim=-1) if k else (logprobs[:, :0], logprobs[:, :0].long())
    best_values, best_ids = best_values.tolist(), best_ids.tolist()
    out = []
    for row, (target, top) in enumerate(zip(targets, tops)):
        alternatives = [[texts[t], v, t] for v, t in zip(best_values[row][:top], best_ids[row][:top])]
        out.append({"token": texts[target], "id": target, "logprob": chosen[row], "top": alternatives})
    return out


def score_prompts(scored: list[tuple[Chunk, int]], logits: torch.Tensor, texts: TokenTexts) -> None:
    """Each scored chunk (with the row of `logits` its first position is at) gives the logprob of
    every prompt token after one of its positions, into its sequence's `prompt_logprobs` by
    position: a prompt computed over several steps is collected across them (one batch each)."""
    rows, targets, tops, owners = [], [], [], []
    for c, at in scored:
        prompt = c.seq.prompt_ids
        for position in range(c.start, min(c.start + c.length, len(prompt) - 1)):
            rows.append(at + position - c.start)
            targets.append(prompt[position + 1])
            tops.append(c.seq.params.prompt_logprobs)
            owners.append((c.seq, position + 1))
    for (seq, position), entry in zip(owners, entries(logits[rows], targets, tops, texts)):
        seq.prompt_logprobs[position] = entry


def token_logprobs(logits: torch.Tensor, seqs: list[Sequence], tokens: list[int], texts: TokenTexts) -> list[dict | None]:
    """The raw logprob of each sampled token (row i of `logits`: seqs[i]'s) whose request asks,
    and its alternatives; None for the others."""
    asking = [i for i, seq in enumerate(seqs) if seq.params.logprobs is not None]
    out: list[dict | None] = [None] * len(seqs)
    if asking:
        found = entries(logits[asking], [tokens[i] for i in asking], [seqs[i].params.logprobs for i in asking], texts)
        for i, entry in zip(asking, found):
            out[i] = entry
    return out
