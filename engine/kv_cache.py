"""KV-cache memory: one contiguous tensor per sequence, charged to one budget in tokens.

Layout of a sequence's cache: [layers, kv_heads, capacity, 2 x head_dim], a position's key and
value side by side (one copy writes both). Its token at position p lives at column p, so attention
reads plain views (`[layer, :, :length, :head_dim]` and `[..., head_dim:]`), with no gather or
copy per step. On a CPU decode is bound by memory bandwidth, and a paged layout
(vLLM's blocks) would copy every sequence's keys into one tensor per layer per step: as many bytes
again as the attention reads. The price of contiguity is a copy when a sequence outgrows its
tensor. That copy is one stream's longest gap between tokens: about 27 ms at a 1,150-token
context of the default model on 2 cores, 3 steps' time. So the tensor is made with SPARE_POSITIONS
more than the capacity: addresses only on a CPU, since a page is memory once written, and a page
past the capacity is written only once the capacity has grown over it (a GPU's memory is taken at
allocation, so there the tensor is the capacity, as before). The capacity grows by
CAPACITY_STEP, and copies only every 1 + SPARE_POSITIONS / CAPACITY_STEP steps (an answer of up
to ~500 tokens never).

The budget is charged for what each sequence holds now (its capacity), not for the most it may
ever need, and not for a padded rectangle of rows: a request with a long prompt costs its own
tokens and nobody else's. The prefix cache (engine/prefix_cache.py) draws on the same budget.
engine/kv_allocator.py hands these caches out; the scheduler never touches a tensor.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

# A sequence's capacity grows in steps of this many positions.
CAPACITY_STEP = 128
# Positions a sequence's tensor holds beyond its capacity (uncharged: never written before charged).
SPARE_POSITIONS = 3 * CAPACITY_STEP


def round_up(n: int, step: int = CAPACITY_STEP) -> int:
    return -(-n // step) * step


@dataclass(frozen=True)
class KVShape:
    layers: int
    kv_heads: int
    head_dim: int
    dtype: torch.dtype
    device: torch.device = torch.device("cpu")

    @property
    def bytes_per_token(self) -> int:
        itemsize = torch.empty((), dtype=self.dtype).element_size()
        return 2 * self.layers * self.kv_heads * self.head_dim * itemsize


class KVMemory:
    """The budget in tokens and what is held of it. Taking never blocks: it fails, and what gives
    way is decided above (engine/kv_allocator.py evicts prefix-cache blocks first, then the
    scheduler preempts)."""

    def __init__(self, budget_tokens: int):
        self.budget_tokens = budget_tokens
        self.used_tokens = 0

    @property
    def free_tokens(self) -> int:
        return self.budget_tokens - self.used_tokens

    def can_ever_fit(self, need: int) -> bool:
        return round_up(need) <= self.budget_tokens

    def take(self, tokens: int) -> bool:
        if tokens > self.free_tokens:
            return False
        self.used_tokens += tokens
        return True

    def give(self, tokens: int) -> None:
        self.used_tokens -= tokens
        assert self.used_tokens >= 0, "KV memory given back twice"


class SequenceKV:
    """One sequence's keys and values (see the module docstring for the layout): `capacity`
    positions charged to the budget and writable, in a tensor of up to SPARE_POSITIONS more."""

    def __init__(self, shape: KVShape, capacity: int, limit: int | None = None):
        """`limit`: the most positions the sequence may ever need (no spare past it)."""
        self.shape = shape
        self.capacity = capacity
        self.data = self._empty(self._room(capacity, limit))

    def _empty(self, positions: int) -> torch.Tensor:
        s = self.shape
        return torch.empty(s.layers, s.kv_heads, positions, 2 * s.head_dim, dtype=s.dtype, device=s.device)

    def _room(self, capacity: int, limit: int | None) -> int:
        if self.shape.device.type != "cpu":
            return capacity  # a GPU allocates every byte at once: no spare beyond the budget's charge
        room = capacity + SPARE_POSITIONS
        return room if limit is None else max(capacity, min(room, round_up(limit)))

    def resize(self, capacity: int, keep: int, limit: int | None = None) -> None:
        """Grow to `capacity` positions, keeping the first `keep`: within the tensor's spare positions
        without a copy, else into a new tensor (with spare positions of its own)."""
        if capacity > self.data.shape[2]:
            new = self._empty(self._room(capacity, limit))
            if keep:
                new[:, :, :keep] = self.data[:, :, :keep]
            self.data = new
        self.capacity = capacity

    def step_views(self, start: int, end: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """For a pass that computes positions start .. end-1, made once per step so that each
        layer only indexes them: where the new keys and values go ([layers, kv_heads, n, 2d]),
        and the keys and values attention reads ([layers, 1, kv_heads, end, d] each)."""
        d = self.shape.head_dim
        return (self.data[:, :, start:end], self.data[:, None, :, :end, :d], self.data[:, None, :, :end, d:])
