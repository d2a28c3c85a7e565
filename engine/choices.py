"""A request's n answers (SamplingParams.n): its sequences, and when it has ended.

The prompt is prefilled once, as choice 0's sequence. At its first token the engine forks it:
choices 1..n-1 are new sequences with a copy of its KV (engine/kv_allocator.KVAllocator.fork),
each sampling its own first token from the same logits with its own seed
(engine/sampling.choice_seed). A resumed request (EngineRequest.choices) starts with its
unfinished choices as sequences of their own, prompt and tokens so far prefilled, and no fork.
"""
from __future__ import annotations

from engine.sampling import choice_seed
from engine.sequence import SamplingParams, Sequence


class RequestChoices:
    def __init__(self, request_id: str, params: SamplingParams, seed: int, prompt_ids: list[int],
                 resume: list[tuple[int, list[int]]] | None, batch: bool, arrived: float):
        self.request_id = request_id
        self.n = params.n
        self.finish_reasons: list[str | None] = [None] * self.n
        self.completion_tokens = 0  # summed as choices end
        self.prompt_ids = prompt_ids
        self._params, self._seed = params, seed
        self._batch, self._arrived = batch, arrived
        if resume is not None and sorted(resume) == [(choice, []) for choice in range(self.n)]:
            resume = None  # handed over before any token: as good as new, so one prefill again
        if resume is None:
            self.live = [self._sequence(0, [])]
            self.forked = self.n == 1
        else:  # (choice, tokens it generated); `resume_ids` arrive as [(0, resume_ids)]
            self.live = [self._sequence(choice, ids) for choice, ids in resume]
            self.forked = True

    def _sequence(self, choice: int, generated: list[int]) -> Sequence:
        return Sequence(self.request_id, self.prompt_ids, self._params, choice_seed(self._seed, choice), generated,
                        batch=self._batch, arrived=self._arrived, choice=choice)

    def fork(self, parent: Sequence) -> list[Sequence]:
        """The further choices, at parent's (choice 0's) first token; [] once done."""
        if self.forked or parent.choice != 0 or parent.output_ids:
            return []
        self.forked = True
        children = [self._sequence(choice, []) for choice in range(1, self.n)]
        self.live.extend(children)
        return children

    def end(self, seq: Sequence, reason: str) -> bool:
        """seq (one choice) ended; True when it was the request's last."""
        self.live.remove(seq)
        self.finish_reasons[seq.choice] = reason
        self.completion_tokens += len(seq.output_ids)
        return not self.live
