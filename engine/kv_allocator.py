"""The KV owner: gives each admitted sequence its cache, grows it, takes it back, and moves blocks
between it and the prefix cache. The scheduler (engine/scheduler.py) decides who runs and who
gives way; this does the allocating and copying it asks for, as nano-vllm's scheduler asks its
block manager.

A sequence is charged for what it holds (engine/kv_cache.py): its context and next token at
admission, capped at the most it may ever need, then CAPACITY_STEP more positions whenever it
outgrows that. Cached prefix blocks draw on the same budget and are evicted before anything is
refused.
"""
from __future__ import annotations

from engine.kv_cache import CAPACITY_STEP, KVMemory, KVShape, SequenceKV, round_up
from engine.prefix_cache import PrefixCache
from engine.sequence import Sequence


class KVAllocator:
    def __init__(self, shape: KVShape, memory: KVMemory, prefix: PrefixCache):
        self.shape = shape
        self.memory = memory
        self.prefix = prefix

    def allocate(self, seq: Sequence) -> bool:
        """Give seq a cache for its context and next token, with the longest cached prefix of its
        context copied in (`num_computed` says how much); False, with nothing taken, when even
        evicting cached prefix blocks leaves no room."""
        capacity = round_up(min(seq.num_tokens + 1, seq.max_total_tokens))
        if not self._take(capacity):
            return False
        seq.kv = SequenceKV(self.shape, capacity, seq.max_total_tokens)
        # A prompt being scored computes every position, as vLLM does: no hit has its logits.
        seq.num_computed = 0 if seq.scores_prompt else self.prefix.attach(seq.all_ids, seq.kv)
        return True

    def fork(self, parent: Sequence, child: Sequence) -> bool:
        """Give child (a further answer to parent's prompt) a cache holding a copy of parent's
        computed positions; False, with nothing taken, when there is no room."""
        capacity = round_up(min(parent.num_computed + 1, child.max_total_tokens))
        if not self._take(capacity):
            return False
        child.kv = SequenceKV(self.shape, capacity, child.max_total_tokens)
        child.kv.data[:, :, :parent.num_computed] = parent.kv.data[:, :, :parent.num_computed]
        child.num_computed = parent.num_computed
        return True

    def room_for_next(self, seq: Sequence) -> bool:
        """Make sure seq's cache holds its next position, growing it by CAPACITY_STEP if need be;
        False, with nothing taken, when even evicting cached prefix blocks leaves no room."""
        if seq.num_computed < seq.kv.capacity:
            return True
        if not self._take(CAPACITY_STEP):
            return False
        seq.kv.resize(seq.kv.capacity + CAPACITY_STEP, keep=seq.num_computed, limit=seq.max_total_tokens)
        return True

    def remember(self, seq: Sequence) -> None:
        """Offer seq's computed blocks to the prefix cache (a prompt just computed)."""
        self.prefix.remember(seq.all_ids, seq.kv, seq.num_computed)

    def release(self, seq: Sequence, remember: bool = False) -> None:
        """Take seq's cache back (it is prefilled again if it runs again); `remember`: offer its
        computed blocks to the prefix cache too (a sequence that ended well)."""
        kv, computed = seq.kv, seq.num_computed
        seq.kv, seq.num_computed = None, 0
        if kv is None:
            return
        # Its memory is given back first, so that its blocks can be remembered in it.
        self.memory.give(kv.capacity)
        if remember:
            self.prefix.remember(seq.all_ids, kv, computed)

    def _take(self, tokens: int) -> bool:
        """Memory for `tokens` positions, evicting cached prefix blocks if that is what it takes."""
        if self.memory.take(tokens):
            return True
        self.prefix.evict(tokens - self.memory.free_tokens)
        return self.memory.take(tokens)
