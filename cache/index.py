"""Nearest-neighbour search over one namespace's question embeddings (FAISS).

Exact inner-product search (IndexFlatIP) while the namespace is small; an HNSW graph once it
holds `hnsw_from` entries, where exact search would grow linearly with the entry count.
Both are append-only here: a removed entry becomes a tombstone that searches skip, and the
index is rebuilt from the live vectors when tombstones pass a quarter of it.
"""
from __future__ import annotations

from dataclasses import dataclass

import faiss
import numpy as np


@dataclass(frozen=True)
class Neighbour:
    entry_id: str
    similarity: float
    question: str
    vector: np.ndarray


class VectorIndex:
    def __init__(self, dim: int, hnsw_from: int = 20_000, hnsw_m: int = 32, ef_search: int = 64):
        self.dim = dim
        self.hnsw_from = hnsw_from
        self.hnsw_m = hnsw_m
        self.ef_search = ef_search
        self.live: dict[str, tuple[np.ndarray, str]] = {}  # entry id -> (vector, question)
        self._reset([])

    @property
    def kind(self) -> str:
        return "hnsw" if self._hnsw else "flat"

    def __len__(self) -> int:
        return len(self.live)

    def __contains__(self, entry_id: str) -> bool:
        return entry_id in self.live

    def _reset(self, entry_ids: list[str]) -> None:
        self._hnsw = len(entry_ids) >= self.hnsw_from
        if self._hnsw:
            self.index = faiss.IndexHNSWFlat(self.dim, self.hnsw_m, faiss.METRIC_INNER_PRODUCT)
            self.index.hnsw.efSearch = self.ef_search
        else:
            self.index = faiss.IndexFlatIP(self.dim)
        self.labels: list[str | None] = []  # faiss label -> entry id (None: removed)
        self.label_of: dict[str, int] = {}
        if entry_ids:
            self.index.add(np.stack([self.live[e][0] for e in entry_ids]))
            self.labels = list(entry_ids)
            self.label_of = {e: i for i, e in enumerate(entry_ids)}

    def add(self, entry_id: str, vector: np.ndarray, question: str) -> None:
        if entry_id in self.live:
            return
        self.live[entry_id] = (vector, question)
        self.index.add(vector.reshape(1, -1))
        self.label_of[entry_id] = len(self.labels)
        self.labels.append(entry_id)
        if not self._hnsw and len(self.live) >= self.hnsw_from:
            self._reset(list(self.live))

    def remove(self, entry_id: str) -> None:
        if self.live.pop(entry_id, None) is None:
            return
        self.labels[self.label_of.pop(entry_id)] = None
        if len(self.labels) - len(self.live) > max(64, len(self.labels) // 4):
            self._reset(list(self.live))

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
            vec, question = self.live[entry_id]
            out.append(Neighbour(entry_id, float(score), question, vec))
            if len(out) == k:
                break
        return out
