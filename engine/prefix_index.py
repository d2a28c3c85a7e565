"""The prefix cache's accounting: which token blocks are cached, how a context finds them, and
which give way first. No tensors: the blocks' keys and values are the storage's
(engine/prefix_cache.py), which asks this index what to copy and what to drop.

A context is cut into blocks of BLOCK_TOKENS token ids. Block i's key hashes (key of block i-1,
its token ids), as in nano-vllm's block manager, so one lookup per block finds the longest cached
prefix of any context: a system prompt, a few-shot template, the earlier turns of a conversation.
A hit is checked against the stored token ids and parent, so a hash collision is only a miss.

A hit is copied into the sequence's own cache, not shared by reference (engine/prefix_cache.py
says why), so a cached block is never in use by a running sequence, and its reference count is
the number of cached blocks that continue it: only a block nobody continues (a leaf) may be
evicted, least recently used first, so a chain is shortened from its end and never broken in the
middle.
"""
from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterator
from dataclasses import dataclass

BLOCK_TOKENS = 32


@dataclass
class Block:
    key: int
    parent: int | None
    token_ids: tuple[int, ...]
    children: int = 0  # cached blocks whose parent this is

    def links(self, parent: int | None, token_ids: tuple[int, ...]) -> bool:
        """Whether this is the block of that link of a chain, not another under the same hash."""
        return self.parent == parent and self.token_ids == token_ids


class PrefixIndex:
    def __init__(self, block_tokens: int = BLOCK_TOKENS):
        self.block_tokens = block_tokens
        self.blocks: OrderedDict[int, Block] = OrderedDict()  # least recently used first
        self.query_tokens = 0  # prompt tokens looked up
        self.hit_tokens = 0  # of which were found

    @property
    def cached_tokens(self) -> int:
        return len(self.blocks) * self.block_tokens

    def chain(self, ids: list[int], upto: int) -> Iterator[tuple[int, int | None, tuple[int, ...]]]:
        """(key, parent key, token ids) of every full block in ids[:upto]."""
        parent = None
        n = self.block_tokens
        for start in range(0, upto - upto % n, n):
            tokens = tuple(ids[start:start + n])
            key = hash((parent, tokens))
            yield key, parent, tokens
            parent = key

    def longest_prefix(self, ids: list[int]) -> list[int]:
        """Keys of the cached blocks that begin `ids`, in order, counted as a lookup and its hit.
        The last token never counts: the pass that computes it gives the logits."""
        self.query_tokens += len(ids)
        found: list[int] = []
        for key, parent, tokens in self.chain(ids, len(ids) - 1):
            block = self.blocks.get(key)
            if block is None or not block.links(parent, tokens):
                break
            found.append(key)
        for key in reversed(found):  # the chain's root ends most recent: leaves are evicted first
            self.blocks.move_to_end(key)
        self.hit_tokens += len(found) * self.block_tokens
        return found

    def touch(self, key: int) -> None:
        """A cached block was used again: it goes last in eviction order."""
        self.blocks.move_to_end(key)

    def add(self, key: int, parent: int | None, token_ids: tuple[int, ...]) -> None:
        """A new block continuing `parent` (which is cached, or None for a chain's first block)."""
        self.blocks[key] = Block(key, parent, token_ids)
        if parent is not None:
            self.blocks[parent].children += 1

    def drop_coldest_leaf(self, keep: frozenset[int] | set[int] = frozenset()) -> int | None:
        """Forget the least recently used block nobody continues (other than those in `keep`);
        its key, or None when every block is continued or kept."""
        victim = next((b for b in self.blocks.values() if b.children == 0 and b.key not in keep), None)
        if victim is None:
            return None
        del self.blocks[victim.key]
        if victim.parent is not None and victim.parent in self.blocks:
            self.blocks[victim.parent].children -= 1
        return victim.key

    def clear(self) -> None:
        self.blocks.clear()
