"""What a client asks of the engine (`EngineRequest`), and reading it at the door: its prompt's token
ids, the checks a request must pass (`RequestRejected`, with a stable code, when it can never be
served), and the request's choices (engine/choices.py) that the engine then queues.

Reading touches no engine state but the tokenizer, so any thread may read a request; queueing it
is the inbox's (engine/inbox.py).
"""
from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Callable

from engine import chat_prompt
from engine.choices import RequestChoices
from engine.kv_cache import KVMemory
from engine.sequence import SamplingParams


@dataclass
class EngineRequest:
    request_id: str
    params: SamplingParams = field(default_factory=SamplingParams)
    prompt: str | None = None
    messages: list[dict] | None = None
    prompt_ids: list[int] | None = None
    # Tokens already generated elsewhere; generation continues at index len(resume_ids).
    resume_ids: list[int] = field(default_factory=list)
    batch: bool = False  # the batch lane (engine/scheduler.py): behind interactive work, preemptible
    tools: list[dict] | None = None  # OpenAI function tools, offered to the model by its chat template
    # Resuming a request with n > 1: its unfinished choices, each with the tokens it already
    # generated; each is prefilled with prompt + its tokens and keeps its index and seed.
    choices: list[tuple[int, list[int]]] | None = None


class RequestRejected(Exception):
    """A request the engine can never serve, with a stable error code for the client."""

    def __init__(self, code: str, message: str):
        super().__init__(message)
        self.code = code
        self.message = message


class RequestReader:
    """Reads requests for one engine: its tokenizer, the logits' width (the token ids it knows), its
    model's context and its KV budget bound what a request may ask."""

    def __init__(self, tokenizer, vocab_width: int, context_length: int, kv: KVMemory):
        self.tokenizer = tokenizer
        self.vocab_width = vocab_width
        self.context_length = context_length
        self.kv = kv

    def encode(self, request: EngineRequest) -> list[int]:
        """The prompt's token ids as the engine reads them: its last `truncate_prompt_tokens` when
        that is set (vLLM's rule: the start is dropped, the question at the end kept)."""
        keep = request.params.truncate_prompt_tokens
        if keep is not None and keep < 1:
            raise RequestRejected("invalid_field", f"truncate_prompt_tokens must be at least 1, not {keep}")
        if request.prompt_ids is not None:
            ids = list(request.prompt_ids)
        elif request.messages is not None:
            text = chat_prompt.render(self.tokenizer, request.messages, request.tools)
            ids = self.tokenizer(text, add_special_tokens=False)["input_ids"]
        elif request.prompt is not None:
            ids = self.tokenizer(request.prompt)["input_ids"]
        else:
            raise RequestRejected("invalid_request", "a request needs a prompt, messages or prompt_ids")
        return ids[-keep:] if keep else ids

    def read(self, request: EngineRequest, clock: Callable[[], float]) -> RequestChoices:
        """The request's choices, arrived now on `clock`; raises RequestRejected. A request without
        a seed gets one drawn here, so that a resumed request keeps its random stream too."""
        prompt_ids = self.encode(request)
        params = request.params
        if not prompt_ids:
            raise RequestRejected("empty_prompt", "the prompt is empty after tokenization")
        need = len(prompt_ids) + params.max_tokens
        limit = min(self.context_length, self.kv.budget_tokens)
        if need > self.context_length or not self.kv.can_ever_fit(need):
            raise RequestRejected(
                "context_overflow",
                f"prompt ({len(prompt_ids)} tokens) + max_tokens ({params.max_tokens}) = {need} "
                f"exceeds the {limit} tokens this model and KV budget allow",
            )
        self._check_fields(request)
        seed = params.seed if params.seed is not None else random.getrandbits(63)
        resume = request.choices if request.choices is not None else (
            [(0, request.resume_ids)] if request.resume_ids else None)
        return RequestChoices(request.request_id, params, seed, prompt_ids, resume, request.batch, clock())

    def _check_fields(self, request: EngineRequest) -> None:
        """Fields a client can get wrong that the worker's mapping does not catch."""
        p = request.params
        for name, ids in (("logit_bias", [t for t, _ in p.logit_bias]), ("stop_token_ids", p.stop_token_ids),
                          ("prompt_ids", request.prompt_ids or [])):
            bad = [t for t in ids if not 0 <= t < self.vocab_width]
            if bad:
                raise RequestRejected("invalid_field", f"{name}: token id {bad[0]} is not in 0..{self.vocab_width - 1}")
        for name in ("logprobs", "prompt_logprobs"):
            value = getattr(p, name)
            if value is not None and not 0 <= value <= 20:
                raise RequestRejected("invalid_field", f"{name} must be 0..20, not {value}")
        if p.n < 1:
            raise RequestRejected("invalid_field", f"n must be at least 1, not {p.n}")
        if p.guide is not None:
            from engine.guided import GuideError, check

            try:
                check(p.guide)
            except GuideError as e:
                raise RequestRejected("invalid_guide", e.reason) from None
        if request.choices is not None:
            indices = [c for c, _ in request.choices]
            if not indices or len(set(indices)) != len(indices) or not all(0 <= c < p.n for c in indices):
                raise RequestRejected("invalid_field", f"choices must name distinct choices of 0..{p.n - 1}")
