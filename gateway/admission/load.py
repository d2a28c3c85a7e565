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
from typing import Callable

import redis.asyncio as aioredis

from gateway import metrics
from ops.core import redis_keys, roster
from ops.core.roster import scale_signal
from ops.core.settings import Settings

log = logging.getLogger("brigade.gateway")

SMOOTHING = 0.3  # weight of the newest second in the rate


class LoadMonitor:
    def __init__(self, client: aioredis.Redis, settings: Settings, interval_s: float = 1.0,
                 on_statuses: Callable[[list[dict]], None] | None = None):
        self.redis = client
        self.on_statuses = on_statuses  # told each second's heartbeats (the catalog's live versions)
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
        if self.on_statuses is not None:
            self.on_statuses(statuses)

    async def run(self) -> None:
        while True:
            try:
                self.observe(await roster.live_workers_async(self.redis), time.monotonic())
                await self._gauge_the_fleet()
            except (aioredis.RedisError, OSError, ValueError) as exc:
                log.debug("event=load_monitor_error error=%r", exc)
            await asyncio.sleep(self.interval_s)

    def served_versions(self) -> list[tuple[str, str]]:
        """The model versions live workers serve (and the settings' model, so its gauges exist from the start)."""
        found = {(self.settings.model_name, self.settings.model_version)}
        found |= {(s["model"], s.get("version") or "") for s in self.statuses if s.get("model")}
        return sorted(found)

    async def _gauge_the_fleet(self) -> None:
        """The gateway's /metrics view of what every gateway shares: workers, queue, dead letters, cache."""
        served = self.served_versions()
        lanes = len(redis_keys.PRIORITY_STEPS)
        pipe = self.redis.pipeline(transaction=False)
        for model, version in served:
            for name in redis_keys.queue_lists(model, version):
                pipe.llen(name)
        pipe.llen(redis_keys.DEAD_LETTERS)
        same_redis = self.settings.cache_redis == self.settings.redis_url
        if same_redis:
            pipe.zcard(redis_keys.CACHE_LRU)
        replies = await pipe.execute()
        metrics.WORKERS_ALIVE.set(self.workers)
        queued_by_model: dict[str, int] = {}
        for i, (model, version) in enumerate(served):
            depths = replies[i * lanes:(i + 1) * lanes]
            batch = depths[redis_keys.PRIORITY_STEPS.index(redis_keys.BATCH_STEP)]
            queued = sum(depths) - batch
            metrics.QUEUE_DEPTH.labels(model, version, "interactive").set(queued)
            metrics.QUEUE_DEPTH.labels(model, version, "batch").set(batch)
            queued_by_model[model] = queued_by_model.get(model, 0) + queued
        for model, queued in queued_by_model.items():
            statuses = [s for s in self.statuses if s.get("model", model) == model]
            signal = scale_signal(statuses, queued, self.settings.per_worker_target)
            metrics.WORKERS_DESIRED.labels(model).set(signal.desired)
        rest = replies[len(served) * lanes:]
        metrics.DEAD_LETTERS.set(rest[0])
        if same_redis:
            metrics.CACHE_ENTRIES.labels(self.settings.model_name).set(rest[1])
