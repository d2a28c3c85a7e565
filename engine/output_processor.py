"""A step's sampled tokens into updates (vLLM's output processor): each sequence takes its token,
then the draft tokens its row kept (engine/speculation.py), one update per token, in the order
the step sampled them.

An update carries the token, the text it releases, its logprobs when asked, and on a sequence's
first update the prompt's logprobs when asked. A sequence that takes no token (max_tokens 0: a
prompt only scored) gets one update, without a token, that carries them and ends it. Whether the
sequence ends with the token (`stop_reason`) and the ending (the `Finisher`) are engine/finishing.py's;
a sequence that ends takes none of its further kept draft tokens.
"""
from __future__ import annotations

from typing import Callable

from engine.finishing import Finisher, stop_reason
from engine.logprobs import TokenTexts
from engine.outputs import SequenceUpdate
from engine.sequence import FinishReason, Sequence


class OutputProcessor:
    def __init__(self, finisher: Finisher, token_texts: TokenTexts, eos_ids: set[int], context_length: int,
                 clock: Callable[[], float]):
        self.finisher = finisher
        self.token_texts = token_texts
        self.eos_ids = eos_ids
        self.context_length = context_length
        self.clock = clock
        self.tokens_generated = 0

    def process(self, seqs: list[Sequence], tokens: list[int], logprobs: list[dict | None],
                kept: dict[Sequence, list[int]]) -> list[SequenceUpdate]:
        """seqs[i] takes tokens[i] (with logprobs[i]), then its kept draft tokens."""
        now = self.clock()
        updates = []
        for seq, token, entry in zip(seqs, tokens, logprobs):
            update, reason = self._take(seq, token, entry, now)
            updates.append(update)
            for target in kept.get(seq, ()):  # each kept draft token's position is now computed
                if reason is not None:
                    break
                seq.num_computed += 1
                update, reason = self._take(seq, target, None, now)
                updates.append(update)
        return updates

    def prompt_scored(self, seq: Sequence) -> SequenceUpdate:
        """seq takes no token (max_tokens 0): its prompt's logprobs are complete, and it ends
        "length" with an update that carries them and no token."""
        update = SequenceUpdate(seq.request_id, None, None, "", prompt_tokens=len(seq.prompt_ids), choice=seq.choice)
        self._attach_prompt_logprobs(seq, update)
        return self.finisher.finish(seq, FinishReason.LENGTH, update)

    def _take(self, seq: Sequence, token: int, entry: dict | None, now: float) -> tuple[SequenceUpdate, FinishReason | None]:
        """seq takes `token`: its update, and why seq ends with it (None: it goes on)."""
        if seq.timing.first_token is None:
            seq.timing.first_token = now
        seq.output_ids.append(token)
        self.tokens_generated += 1
        reason, text = stop_reason(seq, token, self.eos_ids, self.context_length)
        update = SequenceUpdate(seq.request_id, len(seq.output_ids) - 1, token, text,
                                prompt_tokens=len(seq.prompt_ids), choice=seq.choice, logprobs=entry)
        self._attach_prompt_logprobs(seq, update)
        if reason is not None:
            self.finisher.finish(seq, reason, update)
        return update, reason

    def _attach_prompt_logprobs(self, seq: Sequence, update: SequenceUpdate) -> None:
        """On seq's first update, when asked: the prompt's logprobs go with it (once)."""
        if seq.prompt_logprobs is None:
            return
        # The first prompt token has no score (nothing precedes it), but its text is part of the
        # prompt an `echo` shows: it gets an entry without a logprob.
        first = {"token": self.token_texts[seq.prompt_ids[0]], "id": seq.prompt_ids[0], "logprob": None, "top": []}
        update.prompt_logprobs = [first] + [seq.prompt_logprobs[i] for i in range(1, len(seq.prompt_ids))]
        seq.prompt_logprobs = None
