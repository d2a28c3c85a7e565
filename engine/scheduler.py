"""Waiting and running queues: admission in micro-batches, continuous batching, KV accounting.

An idle engine waits up to `max_wait_ms` for `max_batch` requests before prefilling them
together (a bigger first batch costs little more than a small one). While sequences run, new
ones join at the next step and finished ones leave at once.

Two lanes: interactive sequences wait ahead of batch ones (`Sequence.batch`), and an interactive
sequence that finds no batch row or KV free preempts running batch sequences, newest first,
as vLLM's recompute preemption does: the batch sequence gives back its row and KV, keeps the
tokens it generated, and waits at the head of the batch lane to be prefilled again (prompt and
tokens so far) when room returns. Batch work thus fills every row the interactive lane leaves,
and an interactive request never waits behind it.
"""
from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass

from engine.kv_cache import SlotKVCache
from engine.sequence import FinishReason, Sequence, SequenceStatus


@dataclass(frozen=True)
class SchedulerConfig:
    max_batch: int = 16
    max_wait_ms: float = 10.0
    max_prefill_tokens: int = 4096


class Scheduler:
    def __init__(self, config: SchedulerConfig, kv: SlotKVCache):
        self.config = config
        self.kv = kv
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.preemptions = 0

    def add(self, seq: Sequence) -> None:
        if seq.batch:
            self.waiting.append(seq)
        else:
            self._before_batch(seq)

    def _before_batch(self, seq: Sequence) -> None:
        """Behind the waiting interactive sequences, ahead of the batch ones: an interactive
        arrival, or a preempted batch sequence (it has work to keep)."""
        head = next((i for i, other in enumerate(self.waiting) if other.batch), len(self.waiting))
        self.waiting.insert(head, seq)

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def seconds_until_admission(self, now: float | None = None) -> float:
        """How long an idle engine should still wait for its micro-batch to fill (0 = go now)."""
        if self.running or not self.waiting or len(self.waiting) >= self.config.max_batch:
            return 0.0
        now = time.monotonic() if now is None else now
        deadline = self.waiting[0].timing.arrived + self.config.max_wait_ms / 1000.0
        return max(0.0, deadline - now)

    def schedule(self) -> tuple[list[Sequence], bool]:
        """The sequences for the next forward pass, and whether it is a prefill."""
        if self.waiting and self.seconds_until_admission() == 0.0:
            admitted = self._admit()
            if admitted:
                return admitted, True
        return list(self.running), False

    def _admit(self) -> list[Sequence]:
        admitted: list[Sequence] = []
        width = 0
        while self.waiting:
            seq = self.waiting[0]
            # A prefill batch is padded to its longest context; keep the padded size bounded.
            new_width = max(width, seq.num_tokens)
            if admitted and new_width * (len(admitted) + 1) > self.config.max_prefill_tokens:
                break
            rows_full = len(self.running) + len(admitted) >= self.config.max_batch
            if rows_full and (seq.batch or not self._preempt_one()):
                break
            slot = self.kv.allocate(seq.max_total_tokens)
            while slot is None and not seq.batch and self._preempt_one():
                slot = self.kv.allocate(seq.max_total_tokens)
            if slot is None:
                break  # waits until running sequences free KV memory
            self.waiting.popleft()
            seq.slot = slot
            seq.status = SequenceStatus.RUNNING
            seq.timing.admitted = time.monotonic()
            admitted.append(seq)
            width = new_width
        self.running.extend(admitted)
        return admitted

    def _preempt_one(self) -> bool:
        """Give the newest running batch sequence's row and KV back; False when none runs."""
        victims = [s for s in self.running if s.batch]
        if not victims:
            return False
        seq = max(victims, key=lambda s: s.timing.admitted or 0.0)
        self.running.remove(seq)
        self.kv.free(seq.slot)
        seq.slot = None
        seq.status = SequenceStatus.WAITING
        self.preemptions += 1
        self._before_batch(seq)
        return True

    def finish(self, seq: Sequence, reason: FinishReason) -> None:
        seq.status = SequenceStatus.FINISHED
        seq.finish_reason = reason
        seq.timing.finished = time.monotonic()
        if seq.slot is not None:
            self.kv.free(seq.slot)
            seq.slot = None
        if seq in self.running:
            self.running.remove(seq)
        else:
            try:
                self.waiting.remove(seq)
            except ValueError:
                pass
