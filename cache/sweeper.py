"""Expired entries deleted, every `cache_sweep_interval_s`, by whichever gateway gets there first.

Entries expire in Redis on their own (a TTL on each key), but the sets that index them (LRU,
expiry, namespace) and every gateway's FAISS index do not: the sweep deletes each expired id once
(whoever removes it from the LRU set does the rest and logs it, cache/store.py) and drops it from
this gateway's indexes; the other gateways drop it as they follow the log. The thresholds relearn
on the same timer (`after_each`): the evidence list is read once a sweep.
"""
from __future__ import annotations

import asyncio
import logging
from typing import Awaitable, Callable

from redis.exceptions import RedisError

from cache.local_indexes import LocalIndexes
from cache.store import EntryStore

log = logging.getLogger("brigade.cache")


class Sweeper:
    def __init__(self, store: EntryStore, local: LocalIndexes, interval_s: float,
                 after_each: Callable[[], Awaitable[object]] | None = None):
        self.store = store
        self.local = local
        self.interval_s = interval_s
        self.after_each = after_each  # what else runs once a sweep (the thresholds' relearning)

    async def sweep(self) -> int:
        """Delete expired entries (any gateway may; each id is deleted once)."""
        removed = 0
        for entry_id in await self.store.expired():
            if await self.store.delete(entry_id, "expirations"):
                removed += 1
            self.local.forget(entry_id)
        return removed

    async def run(self) -> None:
        """Sweep every `interval_s`, forever; a Redis failure waits for the next round."""
        while True:
            await asyncio.sleep(self.interval_s)
            try:
                await self.sweep()
                if self.after_each is not None:
                    await self.after_each()
            except (RedisError, OSError) as exc:
                log.warning("event=cache_sweep_failed error=%r", exc)
