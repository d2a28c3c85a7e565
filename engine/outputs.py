"""What the engine hands out: a step's update to one request, and a whole answer gathered from them.

A request with n > 1 answers (SamplingParams.n) has n choices; each update says which choice it
belongs to. `choice_finish_reason` marks the end of one choice, `finish_reason` the end of the
request (the update that ends its last choice; with n == 1 the two come together).
"""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class SequenceUpdate:
    """What one step did to one choice of a request: a new token, and/or its end."""

    request_id: str
    index: int | None  # the token's position in the output (None: ended without a new token)
    token_id: int | None
    text: str
    finish_reason: str | None = None  # the request ended
    prompt_tokens: int = 0  # on every token update and at the end
    # At a choice's end: its tokens; at the request's end: the sum over its choices.
    completion_tokens: int = 0
    timing: dict | None = None
    choice: int = 0
    # {"token": text, "logprob": float, "top": [[text, logprob, id], ...]} (engine/logprobs.py)
    logprobs: dict | None = None
    # On choice 0's first update, when asked: one entry per prompt token, the first None.
    prompt_logprobs: list | None = None
    choice_finish_reason: str | None = None  # this choice ended
    finish_reasons: list[str | None] | None = None  # per choice, at the request's end (n > 1)


@dataclass
class Completion:
    """A whole answer gathered from updates (for library use): `text` and `token_ids` are choice
    0's, the `*_by_choice` lists every choice's."""

    request_id: str
    text: str = ""
    token_ids: list[int] = field(default_factory=list)
    finish_reason: str | None = None
    timing: dict | None = None
    texts: list[str] = field(default_factory=list)
    token_ids_by_choice: list[list[int]] = field(default_factory=list)
    logprobs_by_choice: list[list[dict]] = field(default_factory=list)
    finish_reasons: list[str | None] = field(default_factory=list)
    prompt_logprobs: list | None = None
    completion_tokens: int = 0

    def absorb(self, update: SequenceUpdate) -> None:
        c = update.choice
        while len(self.texts) <= c:
            self.texts.append("")
            self.token_ids_by_choice.append([])
            self.logprobs_by_choice.append([])
            self.finish_reasons.append(None)
        self.texts[c] += update.text
        if update.token_id is not None:
            self.token_ids_by_choice[c].append(update.token_id)
        if update.logprobs is not None:
            self.logprobs_by_choice[c].append(update.logprobs)
        if update.prompt_logprobs is not None:
            self.prompt_logprobs = update.prompt_logprobs
        if update.choice_finish_reason is not None:
            self.finish_reasons[c] = update.choice_finish_reason
        self.text, self.token_ids = self.texts[0], self.token_ids_by_choice[0]
        if update.finish_reason is not None:
            self.finish_reason = update.finish_reason
            self.timing = update.timing
            self.completion_tokens = update.completion_tokens
