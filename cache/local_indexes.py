"""One gateway's FAISS indexes, one per namespace, and their rebuilds off the event loop.

The answer cache feeds them from Redis (cache/log_follower.py, cache/insert_path.py); this
module only keeps them: add, forget, raise an entry's bar, and rebuild an index (flat to HNSW,
or compaction) on a worker thread while lookups go on with the old one.
"""
from __future__ import annotations

import asyncio
import logging
from typing import Callable

from cache.index import Item, VectorIndex

log = logging.getLogger("brigade.cache")


class LocalIndexes:
    def __init__(self, dim: int, hnsw_from: int, in_background: Callable):
        self.dim = dim
        self.hnsw_from = hnsw_from
        self._in_background = in_background  # runs a coroutine in the background (the cache's)
        self.indexes: dict[str, VectorIndex] = {}
        self.namespace_of: dict[str, str] = {}  # entry id -> namespace, for deletes that name none
        self.rebuilding: set[str] = set()

    def clear(self) -> None:
        self.indexes, self.namespace_of = {}, {}

    def size(self) -> int:
        return sum(len(i) for i in self.indexes.values())

    def add(self, namespace: str, entry_id: str, item: Item) -> None:
        index = self.indexes.get(namespace)
        if index is None:
            index = self.indexes[namespace] = VectorIndex(self.dim, hnsw_from=self.hnsw_from)
        index.add(entry_id, item)
        self.namespace_of[entry_id] = namespace
        self._maybe_rebuild(namespace, index)

    def set_bar(self, entry_id: str, bar: float) -> None:
        namespace = self.namespace_of.get(entry_id)
        if namespace is not None and namespace in self.indexes:
            self.indexes[namespace].set_bar(entry_id, bar)

    def forget(self, entry_id: str) -> None:
        namespace = self.namespace_of.pop(entry_id, None)
        index = self.indexes.get(namespace) if namespace is not None else None
        if index is None:
            return
        index.remove(entry_id)
        if not len(index) and namespace not in self.rebuilding:
            del self.indexes[namespace]  # every conversation makes a namespace: drop the empty ones
        else:
            self._maybe_rebuild(namespace, index)

    def _maybe_rebuild(self, namespace: str, index: VectorIndex) -> None:
        if not index.rebuild_due or namespace in self.rebuilding:
            return
        try:
            asyncio.get_running_loop()
        except RuntimeError:  # offline (no event loop to keep responsive): rebuild here
            index.compact()
            return
        self.rebuilding.add(namespace)
        self._in_background(self._rebuild_index(namespace, index))

    async def _rebuild_index(self, namespace: str, index: VectorIndex) -> None:
        """Build on a worker thread (seconds at 100k entries) while lookups use the old index."""
        try:
            ids, vectors = index.snapshot()
            built = await asyncio.to_thread(VectorIndex.build, index.dim, vectors, index.hnsw_from, index.hnsw_m,
                                            index.ef_search)
            index.install(ids, built)
            log.info("event=cache_index_rebuilt_in_background namespace=%s entries=%d kind=%s", namespace[:12],
                     len(index), index.kind)
        finally:
            self.rebuilding.discard(namespace)
            if not len(index) and self.indexes.get(namespace) is index:
                del self.indexes[namespace]
