"""The end of a sequence, in one place: why it ends after a step, and the ending itself.

Why, after each token it takes (vLLM's stop checker), in order: end-of-sequence (unless
ignore_eos), a stop string (engine/detokenizer.py), a stop token id, a guide whose grammar is
complete: "stop"; max_tokens or the model's context: "length"; a degenerate loop, where the
sequence is watched for one (engine/repetition.py): "repetition". Nothing but the length ends an
answer before min_tokens (vLLM's rule: its EOS and stop token ids are masked,
engine/logits_processing.py, and its stop strings not looked for). Besides, every choice of a
request ends "cancelled" when the request is cancelled, and "error" when a pass that carried it
raised.

The ending: the sequence is marked finished, with its reason and time; it leaves the scheduler's
queues and gives its KV back (its blocks offered to the prefix cache, unless it failed); its
request records the choice's end (engine/choices.py). The update that ends a choice says so
(`choice_finish_reason`, its tokens); the one that ends a request's last choice also says the
request ended (`finish_reason`, the tokens of all its choices, each choice's reason when n > 1,
its timing), and the engine holds the request no more.
"""
from __future__ import annotations

from typing import Callable, Protocol

from engine.choices import RequestChoices
from engine.inbox import RequestInbox
from engine.outputs import SequenceUpdate
from engine.sequence import FinishReason, Sequence, SequenceStatus


def stop_reason(seq: Sequence, token: int, eos_ids: set[int], context_length: int) -> tuple[FinishReason | None, str]:
    """seq just took `token` (already in its output): the text it releases, and why seq ends
    with it (None: it goes on). Its guide's matcher, if any, accepts the token."""
    p, detok = seq.params, seq.detok
    may_stop = len(seq.output_ids) >= p.min_tokens
    if seq.matcher is not None:
        seq.matcher.accept(token)
    reason = None
    if token in eos_ids and not p.ignore_eos and may_stop:
        text, reason = "", FinishReason.STOP  # EOS's own text is never part of the answer
    else:
        text = detok.push(token, check_stop=may_stop)
        if detok.stopped or (may_stop and token in p.stop_token_ids):
            reason = FinishReason.STOP
        elif seq.matcher is not None and seq.matcher.done:
            reason = FinishReason.STOP
        elif len(seq.output_ids) >= p.max_tokens or seq.num_tokens >= context_length:
            reason = FinishReason.LENGTH
        elif seq.repeats is not None and seq.repeats.took(seq.output_ids) and may_stop:
            reason = FinishReason.REPETITION
    # Text held back as a possible stop string is final once the answer ends otherwise.
    if reason in (FinishReason.LENGTH, FinishReason.REPETITION) or (reason is FinishReason.STOP and not detok.stopped):
        text += detok.flush()
    return reason, text


class Queues(Protocol):
    """What ending a sequence asks of the scheduler (engine/scheduler.Scheduler)."""

    def leave(self, seq: Sequence, remember: bool) -> None:
        """seq leaves its queue; running, it gives its KV back (offered to the prefix cache if asked)."""


class Finisher:
    """Performs the ends of one engine's sequences (on the engine thread): a choice's, after the token
    `stop_reason` ended it on, and every choice of a cancelled or failed request."""

    def __init__(self, queues: Queues, requests: RequestInbox, clock: Callable[[], float]):
        self.queues = queues
        self.requests = requests
        self.clock = clock

    def finish(self, seq: Sequence, reason: FinishReason, update: SequenceUpdate | None = None) -> SequenceUpdate:
        """End one choice, with the update of the token it ended on (None: an update without a
        token); the update that ends a request's last choice says the request ended."""
        seq.status = SequenceStatus.FINISHED
        seq.finish_reason = reason
        seq.timing.finished = self.clock()
        # A pass that raised may have left the failed sequence's cache half-written: none of it is
        # offered to the prefix cache.
        self.queues.leave(seq, remember=reason is not FinishReason.ERROR)
        group = self.requests.get(seq.request_id)
        if update is None:
            update = SequenceUpdate(seq.request_id, None, None, "", choice=seq.choice)
        update.choice_finish_reason = reason.value
        update.prompt_tokens = len(seq.prompt_ids)
        update.completion_tokens = len(seq.output_ids)
        if group.end(seq, reason.value):
            self.requests.ended(seq.request_id)
            update.finish_reason = reason.value
            update.completion_tokens = group.completion_tokens
            if group.n > 1:
                update.finish_reasons = list(group.finish_reasons)
            update.timing = seq.timing.summary(len(seq.output_ids) - seq.resumed_tokens)
        return update

    def cancel(self, group: RequestChoices) -> list[SequenceUpdate]:
        """Every live choice of a cancelled request ends "cancelled"; nothing when the engine holds
        that request no more (it ended before the cancel was taken: a new run under its id is not
        its)."""
        if self.requests.get(group.request_id) is not group:
            return []
        return [self.finish(seq, FinishReason.CANCELLED) for seq in list(group.live)]

    def fail(self, request_ids: list[str]) -> list[SequenceUpdate]:
        """A pass that raised: every choice of the requests it carried ends "error"."""
        updates = []
        for request_id in dict.fromkeys(request_ids):
            group = self.requests.get(request_id)
            for seq in list(group.live) if group is not None else []:
                updates.append(self.finish(seq, FinishReason.ERROR))
        return updates
