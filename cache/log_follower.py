"""One gateway's indexes kept in step with the entries every gateway shares in Redis.

At start the indexes are rebuilt from every entry (`rebuild`), and the shared log's last id is
remembered; from then on the log (redis_keys.CACHE_LOG: `add`, `del`, and `bar` when evidence raises
an entry's bar; cache/store.py writes it) is applied as other gateways append to it. A log entry
that fails to apply is logged and skipped, never fatal; a gateway that fell further behind than
the capped log reaches rebuilds.
"""
from __future__ import annotations

import asyncio
import logging

import redis.asyncio as aioredis
from redis.exceptions import RedisError

from cache.index import Item
from cache.local_indexes import LocalIndexes
from cache.store import EntryStore, decode_vector
from ops.core import redis_keys

log = logging.getLogger("brigade.cache")


class SharedLogFollower:
    def __init__(self, client: aioredis.Redis, store: EntryStore, local: LocalIndexes, retry_s: float = 1.0):
        self.redis = client
        self.store = store
        self.local = local
        self.retry_s = retry_s  # the wait after Redis failed a read, before reading again
        self.cursor = "0-0"  # the id of the last log entry applied here
        self.stopping = False

    async def rebuild(self) -> int:
        """Load every entry from Redis into fresh indexes; remember where the log stood."""
        last = await self.redis.xrevrange(redis_keys.CACHE_LOG, count=1)
        self.cursor = last[0][0] if last else "0-0"
        self.local.clear()
        n = 0
        async for entry_id, namespace, item in self.store.scan_entries():
            self.local.add(namespace, entry_id, item)
            n += 1
        log.info("event=cache_index_rebuilt entries=%d namespaces=%d", n, len(self.local.indexes))
        return n

    def stop(self) -> None:
        """End `follow` after its current read (within its block_ms). Cancelling the task instead
        can leave it for ever in redis-py's cancellation of a blocking XREAD (redis/redis-py#2028,
        #2579): a test's event loop then waited on it at shutdown (twice in 2026-12's suites)."""
        self.stopping = True

    async def follow(self, block_ms: int = 1000) -> None:
        """Apply the shared add/delete log to the local indexes until `stop`."""
        while not self.stopping:
            try:
                replies = await self.redis.xread({redis_keys.CACHE_LOG: self.cursor}, block=block_ms, count=1000)
                for _, events in replies or []:
                    for event_id, fields in events:
                        try:
                            self.apply(fields)
                        except Exception:  # one bad log entry must not stop this gateway following
                            log.exception("event=cache_log_entry_failed entry=%s", event_id)
                        self.cursor = event_id
                await self._check_not_trimmed()
            except (RedisError, OSError) as exc:
                log.warning("event=cache_follow_failed error=%r", exc)
                await asyncio.sleep(self.retry_s)

    def apply(self, event: dict) -> None:
        """One log entry, as cache/store.py wrote it."""
        if event.get("op") == "add" and event.get("vector"):
            self.local.add(event["namespace"], event["id"], Item(decode_vector(event["vector"]), event.get("question", ""),
                                                            event.get("answer", ""), float(event.get("bar") or 0.0)))
        elif event.get("op") == "bar":
            self.local.set_bar(event["id"], float(event["bar"]))
        elif event.get("op") == "del":
            self.local.forget(event["id"])

    async def _check_not_trimmed(self) -> None:
        # A gateway that fell further behind than the capped log reaches must start over.
        first = await self.redis.xrange(redis_keys.CACHE_LOG, count=1)
        if first and self.cursor != "0-0" and _id_lt(self.cursor, first[0][0]):
            log.warning("event=cache_log_trimmed_past_cursor cursor=%s", self.cursor)
            await self.rebuild()


def _id_lt(a: str, b: str) -> bool:
    ta, sa = (int(x) for x in a.split("-"))
    tb, sb = (int(x) for x in b.split("-"))
    return (ta, sa) < (tb, sb)
