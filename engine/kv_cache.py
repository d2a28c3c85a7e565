"""KV-cache memory: one row (a slot) per running sequence, bounded by a budget in tokens.

Layout, per layer: keys and values of shape [rows, kv_heads, capacity, head_dim]. A running
sequence owns one row; its token at position p lives at column p. Decode then reads plain
views (`[:rows, :, :length]`) with no gather or copy per step, which matters on a CPU where
decode is bound by memory bandwidth. The price is padding: the tensor is a rectangle of
rows x capacity, and the budget is charged for the whole rectangle, not for the sum of the
sequences' own lengths. The rectangle is resized only when a sequence is admitted (growth) or
when admission would not fit (shrink to the tightest rectangle), never during a decode step.

The object also stands in for a transformers `Cache` during a forward pass: attention layers
call `update(keys, values, layer_idx)`, and the plan set by `plan_prefill` / `plan_decode`
says where the new keys go.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

# Capacity grows in steps of this many positions, so admissions rarely reallocate.
CAPACITY_STEP = 128


def _round_up(n: int, step: int) -> int:
    return -(-n // step) * step


@dataclass(frozen=True)
class KVShape:
    layers: int
    kv_heads: int
    head_dim: int
    dtype: torch.dtype

    @property
    def bytes_per_token(self) -> int:
        itemsize = torch.empty((), dtype=self.dtype).element_size()
        return 2 * self.layers * self.kv_heads * self.head_dim * itemsize


class SlotKVCache:
    def __init__(self, shape: KVShape, budget_tokens: int, max_slots: int):
        self.shape = shape
        self.budget_tokens = budget_tokens
        self.max_slots = max_slots
        self.rows = 0
        self.capacity = 0
        self.keys: list[torch.Tensor] = []
        self.values: list[torch.Tensor] = []
        # slot -> the positions its sequence may ever need
        self.reserved: dict[int, int] = {}
        # (mode, rows, positions, length) for the next forward pass
        self._plan: tuple[str, torch.Tensor, torch.Tensor | None, int] | None = None

    # ---- accounting -------------------------------------------------------------------------

    @property
    def used_tokens(self) -> int:
        """Tokens of KV memory held now (the rectangle)."""
        return self.rows * self.capacity

    def can_ever_fit(self, need: int) -> bool:
        return _round_up(need, CAPACITY_STEP) <= self.budget_tokens

    def _tight(self, slots: dict[int, int]) -> tuple[int, int]:
        if not slots:
            return 0, 0
        return max(slots) + 1, _round_up(max(slots.values()), CAPACITY_STEP)

    def allocate(self, need: int) -> int | None:
        """Reserve a slot for a sequence that may need `need` positions; None if it must wait."""
        free = [s for s in range(self.max_slots) if s not in self.reserved]
        if not free:
            return None
        slot = free[0]
        wanted = dict(self.reserved)
        wanted[slot] = need
        # Grow the current rectangle if that fits; otherwise try the tightest one.
        rows = max(self.rows, slot + 1)
        capacity = max(self.capacity, _round_up(need, CAPACITY_STEP))
        if rows * capacity > self.budget_tokens:
            rows, capacity = self._tight(wanted)
            if rows * capacity > self.budget_tokens:
                return None
        self.reserved[slot] = need
        self._resize(rows, capacity)
        return slot

    def free(self, slot: int) -> None:
        self.reserved.pop(slot, None)
        if not self.reserved:
            self._resize(0, 0)  # idle: give the memory back

    def _resize(self, rows: int, capacity: int) -> None:
        if (rows, capacity) == (self.rows, self.capacity):
            return
        shape = self.shape
        new_keys, new_values = [], []
        keep_r, keep_c = min(rows, self.rows), min(capacity, self.capacity)
        for layer in range(shape.layers if rows and capacity else 0):
            k = torch.zeros(rows, shape.kv_heads, capacity, shape.head_dim, dtype=shape.dtype)
            v = torch.zeros_like(k)
            if keep_r and keep_c:
                k[:keep_r, :, :keep_c] = self.keys[layer][:keep_r, :, :keep_c]
                v[:keep_r, :, :keep_c] = self.values[layer][:keep_r, :, :keep_c]
            new_keys.append(k)
            new_values.append(v)
        self.keys, self.values = new_keys, new_values
        self.rows, self.capacity = rows, capacity

    # ---- the forward-pass plan ----------------------------------------------------------------

    def plan_prefill(self, slots: list[int], length: int) -> None:
        """Next forward writes `length` positions (from 0) of each row into these slots."""
        self._plan = ("prefill", torch.tensor(slots, dtype=torch.long), None, length)

    def plan_decode(self, rows: int, positions: list[int], view_length: int) -> None:
        """Next forward writes one position per row 0..rows-1 and attends over `view_length`."""
        self._plan = ("decode", torch.arange(rows), torch.tensor(positions, dtype=torch.long), view_length)

    def update(self, key_states, value_states, layer_idx, *args, **kwargs):
        assert self._plan is not None, "forward pass without a KV plan"
        mode, rows, positions, length = self._plan
        keys, values = self.keys[layer_idx], self.values[layer_idx]
        if mode == "prefill":
            keys[rows, :, :length] = key_states
            values[rows, :, :length] = value_states
            # A fresh prefill attends only to its own tokens.
            return key_states, value_states
        keys[rows, :, positions] = key_states[:, :, 0]
        values[rows, :, positions] = value_states[:, :, 0]
        n = rows.shape[0]
        return keys[:n, :, :length], values[:n, :, :length]

    # transformers asks a few questions of its cache; these answer them for a 4D-mask forward.
    def get_seq_length(self, layer_idx: int = 0) -> int:
        return 0

    @property
    def is_compileable(self) -> bool:
        return False
