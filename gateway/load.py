"""What the gateway knows of the workers' load, for refusing work it could not serve in time.

Once a second it reads every worker's heartbeat (requests served, requests waiting in its engine)
and keeps a smoothed rate of requests finished per second across the fleet. The estimated wait of
a new request is the work ahead of it divided by that rate; with no rate yet (nothing finished
since start) there is no estimate, and only the queue-depth limit applies.
"""
from __future__ import annotations

import asyncio
import logging
import time

import redis.asyncio as aioredis

from gateway import metrics
from ops.core import fleet, keys
from ops.core.fleet import scale_signal
from ops.core.settings import Settings

log = logging.getLogger("brigade.gateway")

SMOOTHING = 0.3  # weight of the newest second in the rate


class LoadMonitor:
    def __init__(self, client: aioredis.Redis, settings: Settings, interval_s: float = 1.0):
        self.redis = client
        self.settings = settings
        self.interval_s = interval_s
        self.rate: float | None = None  # requests finished per second, all workers
        self.waiting_in_engines = 0
        self.workers = 0
        self.statuses: list[dict] = []  # the last heartbeats read
        self.observed = False  # has read the heartbeats at least once (before that, `workers` means nothing)
        self._served: dict[str, int] = {}
        self._at = time.monotonic()

    def estimated_wait_s(self, queue_depth: int) -> float | None:
        ahead = queue_depth + self.waiting_in_engines
        if ahead == 0:
            return 0.0
        if not self.rate:
            return None
        return ahead / self.rate

    def observe(self, statuses: list[dict], now: float) -> None:
        served = {s["instance"]: int(s.get("requests_served", 0)) for s in statuses if "instance" in s}
        finished = sum(max(0, n - self._served.get(i, n)) for i, n in served.items())
        elapsed = max(now - self._at, 1e-3)
        sample = finished / elapsed
        busy = any(s.get("running") or s.get("waiting") for s in statuses)
        if finished or busy:
            self.rate = sample if self.rate is None else (1 - SMOOTHING) * self.rate + SMOOTHING * sample
        self._served, self._at = served, now
        self.waiting_in_engines = sum(int(s.get("waiting", 0)) for s in statuses)
        self.workers = len(statuses)
        self.statuses = statuses
        self.observed = True

    async def any_worker_alive(self) -> bool:
        """Asked before refusing for want of workers: the once-a-second view may be a second old."""
        try:
            return await fleet.any_alive_async(self.redis)
        except aioredis.RedisError:
            return True  # unknown: let the enqueue decide

    async def run(self) -> None:
        while True:
            try:
                self.observe(await fleet.live_workers_async(self.redis), time.monotonic())
                await self._gauge_the_fleet()
            except (aioredis.RedisError, OSError, ValueError) as exc:
                log.debug("event=load_monitor_error error=%r", exc)
            await asyncio.sleep(self.interval_s)

    async def _gauge_the_fleet(self) -> None:
        """The gateway's /metrics view of what every gateway shares: workers, queue, dead letters, cache."""
        model = self.settings.model_name
        pipe = self.redis.pipeline(transaction=False)
        for name in keys.queue_lists(model):
            pipe.llen(name)
        pipe.llen(keys.DEAD_LETTERS)
        same_redis = self.settings.cache_redis == self.settings.redis_url
        if same_redis:
            pipe.zcard(keys.CACHE_LRU)
        replies = await pipe.execute()
        lanes = len(keys.queue_lists(model))
        batch = replies[keys.PRIORITY_STEPS.index(keys.BATCH_STEP)]
        queued = sum(replies[:lanes]) - batch
        metrics.WORKERS_ALIVE.set(self.workers)
        metrics.QUEUE_DEPTH.labels(model, "interactive").set(queued)
        metrics.QUEUE_DEPTH.labels(model, "batch").set(batch)
        signal = scale_signal(self.statuses, queued, self.settings.per_worker_target)
        metrics.WORKERS_DESIRED.labels(model).set(signal.desired)
        metrics.DEAD_LETTERS.set(replies[lanes])
        if same_redis:
            metrics.CACHE_ENTRIES.labels(model).set(replies[lanes + 1])
