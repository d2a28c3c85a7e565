"""Which worker holds which prefix-cache block: this gateway's copy of the index every gateway
shares (prefix-aware routing, docs/scaling.md).

Workers write what their caches store and evict (workers/prefix_report.py): a set per worker (its
snapshot, `redis_keys.prefix_blocks`) and one shared capped log (`redis_keys.PREFIX_LOG`). `WorkerPrefixes`
is the index, pure: block key -> the workers that hold it, and for a prompt's chain of block keys,
how far each worker holds it. `PrefixFollower` keeps it current: it reads every live worker's
snapshot, then follows the log; it reads the snapshots again after any Redis error (a restart, a
Sentinel failover: a replica may lack the last entries) and when a worker's report was a whole
snapshot. The index is a hint: a block it wrongly names costs that request a prefill, never a
wrong answer, and a worker it does not know gets no routed request.
"""
from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable

import redis.asyncio as aioredis

from ops.core import redis_keys, roster

log = logging.getLogger("brigade.gateway")

READ_BLOCK_MS = 1_000
READ_COUNT = 500
REBUILD_PAUSE_S = 0.5


class WorkerPrefixes:
    def __init__(self):
        self.holders: dict[str, set[str]] = {}  # block key (16 hex digits) -> worker instances
        self.held: dict[str, set[str]] = {}  # worker instance -> its block keys

    def store(self, instance: str, blocks: Iterable[str]) -> None:
        mine = self.held.setdefault(instance, set())
        for block in blocks:
            mine.add(block)
            self.holders.setdefault(block, set()).add(instance)

    def evict(self, instance: str, blocks: Iterable[str]) -> None:
        mine = self.held.get(instance)
        if mine is None:
            return
        for block in blocks:
            mine.discard(block)
            owners = self.holders.get(block)
            if owners is not None:
                owners.discard(instance)
                if not owners:
                    del self.holders[block]

    def forget(self, instance: str) -> None:
        self.evict(instance, list(self.held.get(instance, ())))
        self.held.pop(instance, None)

    def replace(self, instance: str, blocks: Iterable[str]) -> None:
        self.forget(instance)
        self.store(instance, blocks)

    def matched(self, chain: list[str]) -> dict[str, int]:
        """For a prompt's block keys in order: each worker holding its first block -> how many of
        its blocks, from the first, that worker holds."""
        if not chain:
            return {}
        alive = set(self.holders.get(chain[0], ()))
        depth = dict.fromkeys(alive, 1)
        for block in chain[1:]:
            if not alive:
                break
            alive &= self.holders.get(block, set())
            for instance in alive:
                depth[instance] += 1
        return depth

    def blocks_of(self, instance: str) -> int:
        return len(self.held.get(instance, ()))


class PrefixFollower:
    """Keeps a WorkerPrefixes current from Redis: one asyncio task per gateway."""

    def __init__(self, client: aioredis.Redis, index: WorkerPrefixes):
        self.redis = client
        self.index = index
        self.rebuilds = 0

    async def rebuild(self) -> str:
        """Every live worker's snapshot; returns the log position to follow from."""
        last = await self.redis.xrevrange(redis_keys.PREFIX_LOG, count=1)
        position = last[0][0] if last else "0-0"
        live = {s["instance"] for s in await roster.live_workers_async(self.redis) if "instance" in s}
        for instance in list(self.index.held):
            if instance not in live:
                self.index.forget(instance)
        for instance in live:
            self.index.replace(instance, await self.redis.smembers(redis_keys.prefix_blocks(instance)))
        self.rebuilds += 1
        return position

    async def apply(self, entry: dict) -> None:
        instance = entry.get("w")
        if not instance:
            return
        if entry.get("reset"):
            self.index.replace(instance, await self.redis.smembers(redis_keys.prefix_blocks(instance)))
            return
        if entry.get("s"):
            self.index.store(instance, entry["s"].split())
        if entry.get("e"):
            self.index.evict(instance, entry["e"].split())

    async def run(self) -> None:
        while True:
            try:
                position = await self.rebuild()
                while True:
                    read = await self.redis.xread({redis_keys.PREFIX_LOG: position}, count=READ_COUNT, block=READ_BLOCK_MS)
                    for _, entries in read or []:
                        for entry_id, entry in entries:
                            await self.apply(entry)
                            position = entry_id
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # Redis away or failed over: the snapshots again once it answers
                log.debug("event=prefix_index_rebuild error=%r", exc)
                await asyncio.sleep(REBUILD_PAUSE_S)
