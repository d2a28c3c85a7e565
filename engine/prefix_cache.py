"""Prefix reuse, the storage half: the keys and values of cached token blocks, copied into a
sequence's cache on a hit and out of it when its blocks are remembered. Which blocks are cached,
how a context finds them and which give way first is the accounting's (engine/prefix_index.py).

Where this departs from nano-vllm and vLLM: a hit is copied into the sequence's own contiguous
cache (engine/kv_cache.py), not shared by reference. On this CPU a copy of 1,000 tokens' KV takes
milliseconds against seconds to recompute it, and every decode step then reads contiguous memory;
the cost is that sharers hold a copy each.

Blocks are remembered when a sequence's prompt is computed (so that requests arriving meanwhile
reuse it) and when it finishes (its answer too: the next turn of a conversation starts with it).
They live in the engine's KV budget and give way whenever a sequence needs the memory.
"""
from __future__ import annotations

import torch

from engine.kv_cache import KVMemory, SequenceKV
from engine.prefix_index import BLOCK_TOKENS, PrefixIndex


class PrefixCache:
    def __init__(self, memory: KVMemory, enabled: bool = True, block_tokens: int = BLOCK_TOKENS):
        self.memory = memory
        self.enabled = enabled
        self.block_tokens = block_tokens
        self.index = PrefixIndex(block_tokens)
        self.kv: dict[int, torch.Tensor] = {}  # by block key: [layers, kv_heads, block_tokens, 2 x head_dim]

    @property
    def cached_tokens(self) -> int:
        return self.index.cached_tokens

    @property
    def query_tokens(self) -> int:
        return self.index.query_tokens

    @property
    def hit_tokens(self) -> int:
        return self.index.hit_tokens

    def attach(self, ids: list[int], kv: SequenceKV) -> int:
        """Copy the longest cached prefix of `ids` into `kv`; returns its length in tokens. The
        last token is never taken from the cache: the pass that computes it gives the logits."""
        if not self.enabled:
            return 0
        n = self.block_tokens
        found = self.index.longest_prefix(ids)
        for i, key in enumerate(found):
            kv.data[:, :, i * n:(i + 1) * n] = self.kv[key]
        return len(found) * n

    def remember(self, ids: list[int], kv: SequenceKV, upto: int) -> None:
        """Cache the full blocks of ids[:upto], whose keys and values `kv` holds, from free
        memory or by evicting colder blocks; stops quietly when neither gives room."""
        if not self.enabled:
            return
        n = self.block_tokens
        chain: set[int] = set()
        for i, (key, parent, tokens) in enumerate(self.index.chain(ids, upto)):
            chain.add(key)
            block = self.index.blocks.get(key)
            if block is not None:
                if not block.links(parent, tokens):
                    return  # a hash collision: leave the older block alone
                self.index.touch(key)
                continue
            if not self.memory.take(n) and not (self.evict(n, keep=chain) and self.memory.take(n)):
                return
            self.index.add(key, parent, tokens)
            self.kv[key] = kv.data[:, :, i * n:(i + 1) * n].clone()

    def evict(self, tokens: int, keep: frozenset[int] | set[int] = frozenset()) -> bool:
        """Free at least `tokens` of KV memory by dropping least recently used leaves; False
        (having freed what it could) when the cache runs out first."""
        freed = 0
        while freed < tokens:
            key = self.index.drop_coldest_leaf(keep)
            if key is None:
                return False
            del self.kv[key]
            self.memory.give(self.block_tokens)
            freed += self.block_tokens
        return True

    def clear(self) -> None:
        self.memory.give(self.cached_tokens)
        self.index.clear()
        self.kv.clear()
