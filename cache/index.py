"""Nearest-neighbour search over one namespace's question embeddings (FAISS).

Exact inner-product search (IndexFlatIP) while the namespace is small; an HNSW graph once it
holds `hnsw_from` entries, where exact search would grow linearly with the entry count.
Both are append-only here: a removed entry becomes a tombstone that searches skip, and the
index is rebuilt from the live vectors when tombstones pass a quarter of it.

A rebuild (flat to HNSW, or compaction) takes seconds at 100k entries, so it is split in three:
`snapshot` (the owner's thread, cheap), `build` (any thread, slow, touches nothing shared) and
`install` (the owner's thread: swaps the built index in and adds what arrived meanwhile). The
gateway builds on a worker thread and keeps serving from the old index until the swap;
offline users (eval) call `compact` to do all three at once.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

import faiss
import numpy as np


@dataclass(frozen=True)
class Item:
    """What the index keeps of an entry: its question's vector and what the hit rule reads."""

    vector: np.ndarray
    question: str
    answer: str = ""  # digest of the stored answer (hit_rule: a rival must hold another answer)
    bar: float = 0.0  # the entry's own cosine floor (cache/evidence.py)


@dataclass(frozen=True)
class Neighbour:
    entry_id: str
    similarity: float
    item: Item

    @property
    def question(self) -> str:
        return self.item.question


class VectorIndex:
    def __init__(self, dim: int, hnsw_from: int = 10_000, hnsw_m: int = 32, ef_search: int = 64):
        self.dim = dim
        self.hnsw_from = hnsw_from
        self.hnsw_m = hnsw_m
        self.ef_search = ef_search
        self.live: dict[str, Item] = {}
        self.install([], self.build(dim, [], hnsw_from, hnsw_m, ef_search))

    @property
    def kind(self) -> str:
        return "hnsw" if self._hnsw else "flat"

    def __len__(self) -> int:
        return len(self.live)

    def __contains__(self, entry_id: str) -> bool:
        return entry_id in self.live

    def _reset(self, entry_ids: list[str]) -> None:
        self.install(entry_ids, self.build(self.dim, [self.live[e].vector for e in entry_ids], self.hnsw_from,
                                           self.hnsw_m, self.ef_search))

    @staticmethod
    def build(dim: int, vectors: list[np.ndarray], hnsw_from: int, hnsw_m: int = 32, ef_search: int = 64):
        """A new FAISS index holding `vectors`; pure, so it may run on any thread."""
        if len(vectors) >= hnsw_from:
            index = faiss.IndexHNSWFlat(dim, hnsw_m, faiss.METRIC_INNER_PRODUCT)
            index.hnsw.efSearch = ef_search
        else:
            index = faiss.IndexFlatIP(dim)
        if vectors:
            index.add(np.stack(vectors))
        return index

    def snapshot(self) -> tuple[list[str], list[np.ndarray]]:
        ids = list(self.live)
        return ids, [self.live[e].vector for e in ids]

    def install(self, entry_ids: list[str], index) -> None:
        """Swap in an index built from `entry_ids`' vectors; entries added or removed since are applied."""
        self.index = index
        self._hnsw = isinstance(index, faiss.IndexHNSWFlat)
        self.labels: list[str | None] = [e if e in self.live else None for e in entry_ids]
        self.label_of: dict[str, int] = {e: i for i, e in enumerate(entry_ids) if e in self.live}
        late = [e for e in self.live if e not in self.label_of]
        if late:
            self.index.add(np.stack([self.live[e].vector for e in late]))
            for e in late:
                self.label_of[e] = len(self.labels)
                self.labels.append(e)

    @property
    def rebuild_due(self) -> bool:
        """Tombstones past a quarter of the index, or a flat index grown to the HNSW size."""
        tombstones = len(self.labels) - len(self.live)
        return tombstones > max(64, len(self.labels) // 4) or (not self._hnsw and len(self.live) >= self.hnsw_from)

    def compact(self) -> None:
        """Rebuild now, on this thread (offline use)."""
        if self.rebuild_due:
            self._reset(list(self.live))

    def add(self, entry_id: str, item: Item) -> None:
        if entry_id in self.live:
            return
        self.live[entry_id] = item
        self.index.add(item.vector.reshape(1, -1))
        self.label_of[entry_id] = len(self.labels)
        self.labels.append(entry_id)

    def set_bar(self, entry_id: str, bar: float) -> None:
        item = self.live.get(entry_id)
        if item is not None:
            self.live[entry_id] = replace(item, bar=bar)

    def remove(self, entry_id: str) -> None:
        if self.live.pop(entry_id, None) is None:
            return
        self.labels[self.label_of.pop(entry_id)] = None

    def search(self, vector: np.ndarray, k: int) -> list[Neighbour]:
        if not self.live:
            return []
        tombstones = len(self.labels) - len(self.live)
        fetch = min(len(self.labels), k + tombstones if tombstones < 4 * k else 4 * k)
        scores, labels = self.index.search(vector.reshape(1, -1), fetch)
        out = []
        for score, label in zip(scores[0], labels[0]):
            if label < 0:
                continue
            entry_id = self.labels[label]
            if entry_id is None:
                continue
            out.append(Neighbour(entry_id, float(score), self.live[entry_id]))
            if len(out) == k:
                break
        return out
