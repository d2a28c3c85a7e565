"""Waiting and running queues: admission, the chunks of each step, KV memory and preemption.

Every step, each running sequence feeds the context positions whose keys and values it lacks:
one token when decoding; a whole prompt, or a chunk of it, when prefilling (vLLM's and
nano-vllm's unified view of prefill and decode). Decoding sequences always get their token.
Prefilling ones share a token budget: `prefill_chunk_tokens` while any sequence decodes, so a long
prompt loads a chunk per step beside the running streams instead of stalling them for its whole
prefill; `max_prefill_tokens` when nothing decodes, so an idle engine loads prompts in as few
passes as it can (on a CPU a pass is compute-bound and small chunks only add passes).

An idle engine waits up to `max_wait_ms` for `max_batch` requests before admitting them, so that
a burst shares its first pass. While sequences run, new ones join at the next step and finished
ones leave at once.

The scheduler decides; the KV owner (engine/kv_allocator.py) allocates and copies, so this module
touches no tensor and imports no torch. A sequence is charged for what it holds: its context at
admission, then more positions whenever it outgrows that. Admission is not held hostage by one
large request: a sequence that does not fit is passed over and later ones that fit are admitted,
until it has waited `admission_patience_s`; from then on nobody passes it, and it gets the memory
that finishing sequences give back. When running sequences outgrow the memory, cached prefix
blocks go first, then the lowest-priority running sequence is preempted (batch lane before
interactive, newest first), as vLLM's recompute preemption does: it gives back its KV, keeps the
tokens it generated, and waits at the head of its lane to be prefilled again (prompt and tokens
so far; its prompt is usually still in the prefix cache).

Two lanes: interactive sequences wait ahead of batch ones (`Sequence.batch`), and an interactive
sequence that finds no row or memory free at admission preempts running batch sequences, newest
first. Interactive sequences never preempt each other at admission.
"""
from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass
from typing import Callable, Protocol

from engine.sequence import Chunk, Sequence, SequenceStatus


@dataclass(frozen=True)
class SchedulerConfig:
    max_batch: int = 32
    max_wait_ms: float = 10.0
    max_prefill_tokens: int = 4096
    prefill_chunk_tokens: int = 64
    admission_patience_s: float = 2.0


class KVOwner(Protocol):
    """What the scheduler asks of the owner of KV memory (engine/kv_allocator.KVAllocator). Each
    call that needs memory evicts cached prefix blocks before it fails, and a failed call has
    taken nothing."""

    def allocate(self, seq: Sequence) -> bool:
        """A cache for seq at admission, its cached prefix copied in (sets `num_computed`)."""

    def room_for_next(self, seq: Sequence) -> bool:
        """seq's cache holds its next position, grown if need be."""

    def fork(self, parent: Sequence, child: Sequence) -> bool:
        """child's cache with a copy of parent's computed positions; False when no room."""

    def remember(self, seq: Sequence) -> None:
        """seq's computed blocks offered to the prefix cache."""

    def release(self, seq: Sequence, remember: bool = False) -> None:
        """seq's cache given back (`num_computed` back to 0), its blocks remembered first if asked."""


class Scheduler:
    def __init__(self, config: SchedulerConfig, kv: KVOwner, clock: Callable[[], float] = time.monotonic):
        self.config = config
        self.kv = kv
        # The engine's clock, on which arrivals and finishes are timed too: admission times, the
        # micro-batch wait and the admission patience read it (a test drives it by hand).
        self.clock = clock
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

    def _at_lane_head(self, seq: Sequence) -> None:
        """First of its lane: a preempted sequence goes before those that never ran."""
        if seq.batch:
            self._before_batch(seq)
        else:
            self.waiting.appendleft(seq)

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def seconds_until_admission(self, now: float | None = None) -> float:
        """How long an idle engine should still wait for its micro-batch to fill (0 = go now)."""
        if self.running or not self.waiting or len(self.waiting) >= self.config.max_batch:
            return 0.0
        now = self.clock() if now is None else now
        deadline = self.waiting[0].timing.arrived + self.config.max_wait_ms / 1000.0
        return max(0.0, deadline - now)

    # ---- one step ---------------------------------------------------------------------------

    def schedule(self) -> list[Chunk]:
        """The chunks of the next forward pass (empty: nothing to do yet)."""
        if self.waiting and self.seconds_until_admission() == 0.0:
            self._admit()
        return self._plan()

    def computed(self, chunks: list[Chunk]) -> None:
        """After the pass: the chunks' positions are in their caches; a prompt just completed is
        offered to the prefix cache."""
        for c in chunks:
            # A draft's positions count once verified (the engine adds those it keeps).
            c.seq.num_computed = c.start + c.context_length
            if c.samples and c.context_length > 1:
                self.kv.remember(c.seq)

    def fork(self, parent: Sequence, child: Sequence) -> None:
        """A further answer to parent's prompt (SamplingParams.n), at parent's first token: it runs
        at once on a copy of parent's KV if a row and the memory are free, else it waits as any
        new sequence does and is prefilled (its prompt usually from the prefix cache)."""
        if len(self.running) < self.config.max_batch and self.kv.fork(parent, child):
            child.status = SequenceStatus.RUNNING
            child.timing.admitted = self.clock()
            self.running.append(child)
        else:
            self.add(child)

    def _by_priority(self) -> list[Sequence]:
        """Running sequences, most deserving first: interactive before batch, then by arrival."""
        return sorted(self.running, key=lambda s: (s.batch, s.timing.arrived))

    def _plan(self) -> list[Chunk]:
        order = self._by_priority()
        chunks: list[Chunk] = []
        decoding = [s for s in order if s.uncomputed == 1]
        for seq in decoding:
            if seq not in self.running:
                continue  # preempted to make room for a sequence before it
            if self._room_to_decode(seq, order):
                chunks.append(Chunk(seq, seq.num_computed, 1))
        budget = self.config.prefill_chunk_tokens if chunks else self.config.max_prefill_tokens
        for seq in order:
            if budget <= 0:
                break
            if seq.uncomputed > 1 and seq in self.running:
                n = min(seq.uncomputed, budget)
                chunks.append(Chunk(seq, seq.num_computed, n))
                budget -= n
        return chunks

    def _room_to_decode(self, seq: Sequence, order: list[Sequence]) -> bool:
        """Make sure seq's cache holds its next position, growing it and preempting the
        lowest-priority others when memory runs out. False if seq itself was preempted."""
        while not self.kv.room_for_next(seq):
            victim = next((s for s in reversed(order) if s in self.running), None)
            self._preempt(victim)
            if victim is seq:
                return False
        return True

    # ---- admission --------------------------------------------------------------------------

    def _admit(self) -> None:
        now = self.clock()
        for seq in list(self.waiting):
            if len(self.running) >= self.config.max_batch and (seq.batch or not self._preempt_batch()):
                break
            fits = self.kv.allocate(seq)
            while not fits and not seq.batch and self._preempt_batch():
                fits = self.kv.allocate(seq)
            if not fits:
                if seq.passed_over_at is None:
                    seq.passed_over_at = now
                if now - seq.passed_over_at >= self.config.admission_patience_s:
                    break  # it has waited long enough: the memory that frees up is its
                continue
            self.waiting.remove(seq)
            seq.passed_over_at = None
            seq.status = SequenceStatus.RUNNING
            seq.timing.admitted = now
            self.running.append(seq)

    def _preempt_batch(self) -> bool:
        """Give the newest running batch sequence's row and KV back; False when none runs."""
        victims = [s for s in self._by_priority() if s.batch]
        if not victims:
            return False
        self._preempt(victims[-1])
        return True

    def _preempt(self, seq: Sequence) -> None:
        self.running.remove(seq)
        self.kv.release(seq)
        seq.status = SequenceStatus.WAITING
        self.preemptions += 1
        self._at_lane_head(seq)

    def leave(self, seq: Sequence, remember: bool) -> None:
        """A sequence that ended (engine/finishing.py decides why, and whether its blocks are worth
        remembering) leaves its queue at once; a running one gives its KV back, its computed blocks
        offered to the prefix cache first when `remember`."""
        if seq in self.running:
            self.running.remove(seq)
            self.kv.release(seq, remember=remember)
        else:
            try:
                self.waiting.remove(seq)
            except ValueError:
                pass
