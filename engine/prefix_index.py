"""The prefix cache's accounting: which token blocks are cached, how a context finds them, and
which give way first. No tensors: the blocks' keys and values are the storage's
(engine/prefix_cache.py), which asks this index what to copy and what to drop.

A context is cut into blocks of BLOCK_TOKENS token ids. Block i's key hashes (key of block i-1,
its token ids), as in nano-vllm's block manager (with a hash every process computes alike, so a
gateway can route a prompt to the worker holding its blocks: `block_keys`), so one lookup per block finds the longest cached
prefix of any context: a system prompt, a few-shot template, the earlier turns of a conversation.
A hit is checked against the stored token ids and parent, so a hash collision is only a miss.

A hit is copied into the sequence's own cache, not shared by reference (engine/prefix_cache.py
says why), so a cached block is never in use by a running sequence, and its reference count is
the number of cached blocks that continue it: only a block nobody continues (a leaf) may be
evicted, least recently used first, so a chain is shortened from its end and never broken in the
middle.
"""
from __future__ import annotations

import hashlib
from array import array
from collections import OrderedDict
from collections.abc import Iterator
from dataclasses import dataclass, field

BLOCK_TOKENS = 32
# Changes a journal holds before it gives up listing them and asks for a whole snapshot instead.
JOURNAL_MAX = 100_000


def block_key(parent: int | None, token_ids: tuple[int, ...]) -> int:
    """A block's key: a hash of its parent's key and its token ids that every process computes alike
    (Python's own hash of a tuple holding None differs between processes), so a gateway that
    tokenizes a prompt finds the keys a worker's cache holds (docs/scaling.md). 63 bits."""
    h = hashlib.blake2b(digest_size=8)
    h.update((parent or 0).to_bytes(8, "little"))
    h.update(array("q", token_ids).tobytes())
    return int.from_bytes(h.digest(), "little") >> 1


def block_keys(ids: list[int], upto: int | None = None, block_tokens: int = BLOCK_TOKENS) -> list[int]:
    """The keys of every full block of ids[:upto] (by default all but the last token, which a
    lookup never takes from the cache), in order."""
    upto = len(ids) - 1 if upto is None else upto
    keys: list[int] = []
    parent = None
    for start in range(0, upto - upto % block_tokens, block_tokens):
        parent = block_key(parent, tuple(ids[start:start + block_tokens]))
        keys.append(parent)
    return keys


@dataclass
class PrefixChanges:
    """What the cache stored and evicted since it was last asked; `reset`: the list was given up
    (cleared, or too long), and `held` is then every key it holds."""
    stored: list[int] = field(default_factory=list)
    evicted: list[int] = field(default_factory=list)
    reset: bool = False
    held: list[int] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.stored or self.evicted or self.reset)


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
        # Kept only once someone reads it (watch): a worker tells the gateways what it holds.
        self._journal: PrefixChanges | None = None

    def watch(self) -> None:
        """Keep a journal of what is stored and evicted, for `changes()` to hand out."""
        self._journal = PrefixChanges(reset=True)

    def changes(self) -> PrefixChanges:
        """What changed since the last call (an empty PrefixChanges when nobody watches)."""
        journal = self._journal
        if journal is None:
            return PrefixChanges()
        if journal.reset:
            journal.held = list(self.blocks)
        self._journal = PrefixChanges()
        return journal

    def _note(self, stored: int | None = None, evicted: int | None = None) -> None:
        journal = self._journal
        if journal is None or journal.reset:
            return
        if stored is not None:
            journal.stored.append(stored)
        if evicted is not None:
            journal.evicted.append(evicted)
        if len(journal.stored) + len(journal.evicted) > JOURNAL_MAX:
            self._journal = PrefixChanges(reset=True)

    @property
    def cached_tokens(self) -> int:
        return len(self.blocks) * self.block_tokens

    def chain(self, ids: list[int], upto: int) -> Iterator[tuple[int, int | None, tuple[int, ...]]]:
        """(key, parent key, token ids) of every full block in ids[:upto]."""
        parent = None
        n = self.block_tokens
        for start in range(0, upto - upto % n, n):
            tokens = tuple(ids[start:start + n])
            key = block_key(parent, tokens)
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
        self._note(stored=key)

    def drop_coldest_leaf(self, keep: frozenset[int] | set[int] = frozenset()) -> int | None:
        """Forget the least recently used block nobody continues (other than those in `keep`);
        its key, or None when every block is continued or kept."""
        victim = next((b for b in self.blocks.values() if b.children == 0 and b.key not in keep), None)
        if victim is None:
            return None
        del self.blocks[victim.key]
        if victim.parent is not None and victim.parent in self.blocks:
            self.blocks[victim.parent].children -= 1
        self._note(evicted=victim.key)
        return victim.key

    def clear(self) -> None:
        self.blocks.clear()
        if self._journal is not None:
            self._journal = PrefixChanges(reset=True)
