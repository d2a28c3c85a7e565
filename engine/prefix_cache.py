"""Prefix reuse: keys and values of token blocks already computed, found by a hash chain.

A context is cut into blocks of BLOCK_TOKENS token ids. Block i's key hashes (key of block i-1,
its token ids), as in nano-vllm's block manager, so one lookup per block finds the longest cached
prefix of any context: a system prompt, a few-shot template, the earlier turns of a conversation.
A hit is checked against the stored token ids and parent, so a hash collision is only a miss.

Where this departs from nano-vllm and vLLM: a hit is copied into the sequence's own contiguous
cache (engine/kv_cache.py), not shared by reference. On this CPU a copy of 1,000 tokens' KV takes
milliseconds against seconds to recompute it, and every decode step then reads contiguous memory;
the cost is that sharers hold a copy each. So a cached block is never in use by a running
sequence, and its reference count is the number of cached blocks that continue it: only a block
nobody continues (a leaf) may be evicted, least recently used first, so a chain is shortened from
its end and never broken in the middle.

Blocks are remembered when a sequence's prompt is computed (so that requests arriving meanwhile
reuse it) and when it finishes (its answer too: the next turn of a conversation starts with it).
They live in the engine's KV budget and give way whenever a sequence needs the memory.
"""
from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

import torch

from engine.kv_cache import KVMemory, SequenceKV

BLOCK_TOKENS = 32


@dataclass
class Block:
    key: int
    parent: int | None
    token_ids: tuple[int, ...]
    kv: torch.Tensor  # [layers, kv_heads, BLOCK_TOKENS, 2 x head_dim]
    children: int = 0  # cached blocks whose parent this is


class PrefixCache:
    def __init__(self, memory: KVMemory, enabled: bool = True, block_tokens: int = BLOCK_TOKENS):
        self.memory = memory
        self.enabled = enabled
        self.block_tokens = block_tokens
        self.blocks: OrderedDict[int, Block] = OrderedDict()  # least recently used first
        self.query_tokens = 0  # prompt tokens looked up
        self.hit_tokens = 0  # of which were found

    @property
    def cached_tokens(self) -> int:
        return len(self.blocks) * self.block_tokens

    def _chain(self, ids: list[int], upto: int):
        """(key, parent key, token ids) of every full block in ids[:upto]."""
        parent = None
        n = self.block_tokens
        for start in range(0, upto - upto % n, n):
            tokens = tuple(ids[start:start + n])
            key = hash((parent, tokens))
            yield key, parent, tokens
            parent = key

    def attach(self, ids: list[int], kv: SequenceKV) -> int:
        """Copy the longest cached prefix of `ids` into `kv`; returns its length in tokens. The
        last token is never taken from the cache: the pass that computes it gives the logits."""
        if not self.enabled:
            return 0
        self.query_tokens += len(ids)
        found: list[Block] = []
        for key, parent, tokens in self._chain(ids, len(ids) - 1):
            block = self.blocks.get(key)
            if block is None or block.parent != parent or block.token_ids != tokens:
                break
            found.append(block)
        n = self.block_tokens
        for i, block in enumerate(found):
            kv.data[:, :, i * n:(i + 1) * n] = block.kv
        for block in reversed(found):  # the chain's root ends most recent: leaves are evicted first
            self.blocks.move_to_end(block.key)
        hit = len(found) * n
        self.hit_tokens += hit
        return hit

    def remember(self, ids: list[int], kv: SequenceKV, upto: int) -> None:
        """Cache the full blocks of ids[:upto], whose keys and values `kv` holds, from free
        memory or by evicting colder blocks; stops quietly when neither gives room."""
        if not self.enabled:
            return
        n = self.block_tokens
        chain: set[int] = set()
        for i, (key, parent, tokens) in enumerate(self._chain(ids, upto)):
            chain.add(key)
            block = self.blocks.get(key)
            if block is not None:
                if block.parent != parent or block.token_ids != tokens:
                    return  # a hash collision: leave the older block alone
                self.blocks.move_to_end(key)
                continue
            if not self.memory.take(n) and not (self.evict(n, keep=chain) and self.memory.take(n)):
                return
            self.blocks[key] = Block(key, parent, tokens, kv.data[:, :, i * n:(i + 1) * n].clone())
            if parent is not None:
                self.blocks[parent].children += 1

    def evict(self, tokens: int, keep: frozenset[int] | set[int] = frozenset()) -> bool:
        """Free at least `tokens` of KV memory by dropping least recently used leaves; False
        (having freed what it could) when the cache runs out first."""
        freed = 0
        while freed < tokens:
            victim = next((b for b in self.blocks.values() if b.children == 0 and b.key not in keep), None)
            if victim is None:
                return False
            del self.blocks[victim.key]
            if victim.parent is not None and victim.parent in self.blocks:
                self.blocks[victim.parent].children -= 1
            self.memory.give(self.block_tokens)
            freed += self.block_tokens
        return True

    def clear(self) -> None:
        self.memory.give(self.cached_tokens)
        self.blocks.clear()
