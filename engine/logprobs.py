"""Logprobs as the OpenAI API and vLLM report them: a token's, and its best alternatives'.

RAW logprobs (vLLM v1's default): log_softmax of the model's float32 logits before any processing
(temperature, penalties, bias, masks). Gathered in one log_softmax and one topk over every row
that asks, whether the rows are sampled tokens or a scored prompt's positions.

Shape of one entry: {"token": text, "logprob": float, "top": [[text, logprob, id], ...]}, the top
ones best first; a token's text is that token decoded alone.
"""
from __future__ import annotations

import torch


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
        out.append({"token": texts[target], "logprob": chosen[row], "top": alternatives})
    return out
