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

KV memory (engine/kv_cache.py) is charged for what a sequence holds: its context at admission,
then CAPACITY_STEP more positions whenever it outgrows that. Admission is not held hostage by one
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

from engine.kv_cache import CAPACITY_STEP, KVMemory, KVShape, SequenceKV, round_up
from engine.model_runner import Chunk
from engine.prefix_cache import PrefixCache
from engine.sequence import FinishReason, Sequence, SequenceStatus


@dataclass(frozen=True)
class SchedulerConfig:
    max_batch: int = 32
    max_wait_ms: float = 10.0
    max_prefill_tokens: int = 4096
    prefill_chunk_tokens: int = 64
    admission_patience_s: float = 2.0


class Scheduler:
    def __init__(self, config: SchedulerConfig, memory: KVMemory, prefix: PrefixCache, kv_shape: KVShape):
        self.config = config
        self.memory = memory
        self.prefix = prefix
        self.kv_shape = kv_shape
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
        now = time.monotonic() if now is None else now
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
            c.seq.num_computed = c.start + c.length
            if c.samples and c.length > 1:
                self.prefix.remember(c.seq.all_ids, c.seq.kv, c.seq.num_computed)

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
        if seq.num_computed < seq.kv.capacity:
            return True
        while not self._take(CAPACITY_STEP):
            victim = next((s for s in reversed(order) if s in self.running), None)
            self._preempt(victim)
            if victim is seq:
                return False
        seq.kv.resize(seq.kv.capacity + CAPACITY_STEP, keep=seq.num_computed)
        return True

    # ---- admission --------------------------------------------------------------------------

    def _admit(self) -> None:
        now = time.monotonic()
        for seq in list(self.waiting):
            if len(self.running) >= self.config.max_batch and (seq.batch or not self._preempt_batch()):
                break
            capacity = round_up(min(seq.num_tokens + 1, seq.max_total_tokens))
            fits = self._take(capacity)
            while not fits and not seq.batch and self._preempt_batch():
                fits = self._take(capacity)
            if not fits:
                if seq.passed_over_at is None:
                    seq.passed_over_at = now
                if now - seq.passed_over_at >= self.config.admission_patience_s:
                    break  # it has waited long enough: the memory that frees up is its
                continue
            self.waiting.remove(seq)
            seq.passed_over_at = None
            seq.kv = SequenceKV(self.kv_shape, capacity)
            seq.num_computed = self.prefix.attach(seq.all_ids, seq.kv)
            seq.status = SequenceStatus.RUNNING
            seq.timing.admitted = now
            self.running.append(seq)

    def _take(self, tokens: int) -> bool:
        """Memory for `tokens` positions, evicting cached prefix blocks if that is what it takes."""
        if self.memory.take(tokens):
            return True
        self.prefix.evict(tokens - self.memory.free_tokens)
        return self.memory.take(tokens)

    def _preempt_batch(self) -> bool:
        """Give the newest running batch sequence's row and KV back; False when none runs."""
        victims = [s for s in self._by_priority() if s.batch]
        if not victims:
            return False
        self._preempt(victims[-1])
        return True

    def _preempt(self, seq: Sequence) -> None:
        self.running.remove(seq)
        self._release(seq)
        seq.status = SequenceStatus.WAITING
        self.preemptions += 1
        self._at_lane_head(seq)

    def _release(self, seq: Sequence) -> None:
        if seq.kv is not None:
            self.memory.give(seq.kv.capacity)
            seq.kv = None
        seq.num_computed = 0

    def finish(self, seq: Sequence, reason: FinishReason) -> None:
        seq.status = SequenceStatus.FINISHED
        seq.finish_reason = reason
        seq.timing.finished = time.monotonic()
        if seq in self.running:
            self.running.remove(seq)
            kv, computed = seq.kv, seq.num_computed
            # Its memory is given back first, so that its blocks can be remembered in it.
            self._release(seq)
            if reason is not FinishReason.ERROR and kv is not None:
                self.prefix.remember(seq.all_ids, kv, computed)
        else:
            try:
                self.waiting.remove(seq)
            except ValueError:
                pass
