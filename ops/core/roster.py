"""The registry of live workers: who to read, without walking the keyspace.

Each heartbeat writes the worker's status key (its TTL is the truth about liveness: an expired
key is a dead or wedged worker) and, in the same transaction, its instance into one sorted set
scored by the beat's time. Readers (the gateway's load monitor and /readyz, `brigade status`)
read the set, then the status keys of its members: two commands whatever else lives in Redis
(a 100k-entry cache walked by SCAN every second was the cost this replaces). Members whose key
expired stay in the set until a beat drops those silent for FORGET_S (each worker prunes once
every PRUNE_EVERY beats), so the set holds the workers seen in the last ten minutes or so.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass

import redis
import redis.asyncio as aioredis

from ops.core import redis_keys

FORGET_S = 600.0  # generous beside any heartbeat TTL, so clocks that disagree a little do no harm


PRUNE_EVERY = 60  # beats between two prunings of the registry (one command a minute, not a second)


def record_beat(pipe, instance: str, status: dict, ttl_ms: int, now: float, prune: bool = True) -> None:
    """Queue one heartbeat on a pipeline: status key, registry member, and (when `prune`) the
    members silent for FORGET_S dropped. No transaction is needed: a member whose key is missing
    reads as dead, and a key written a moment before its member is seen at the next beat."""
    pipe.set(redis_keys.worker(instance), json.dumps(status), px=ttl_ms)
    pipe.zadd(redis_keys.WORKERS, {instance: now})
    if "model" in status:  # whose own queue this is, for the reaper to return it once the worker is gone
        pipe.hset(redis_keys.WORKER_QUEUES, instance, json.dumps({"model": status["model"], "version": status.get("version", "")}))
    if prune:
        pipe.zremrangebyscore(redis_keys.WORKERS, 0, now - FORGET_S)


def forget(client: redis.Redis, instance: str) -> None:
    """A worker that stops cleanly leaves at once instead of when its key expires."""
    pipe = client.pipeline()
    pipe.delete(redis_keys.worker(instance))
    pipe.zrem(redis_keys.WORKERS, instance)
    pipe.execute()


def _statuses(raws: list) -> list[dict]:
    out = []
    for raw in raws:
        if raw:
            try:
                out.append(json.loads(raw))
            except ValueError:
                continue  # a half-written or foreign value says nothing about a worker
    return out


def live_workers(client: redis.Redis) -> list[dict]:
    """The status of every worker whose heartbeat has not expired."""
    names = client.zrange(redis_keys.WORKERS, 0, -1)
    return _statuses(client.mget([redis_keys.worker(n) for n in names])) if names else []


async def live_workers_async(client: aioredis.Redis) -> list[dict]:
    names = await client.zrange(redis_keys.WORKERS, 0, -1)
    return _statuses(await client.mget([redis_keys.worker(n) for n in names])) if names else []


@dataclass(frozen=True)
class ScaleSignal:
    """The autoscaling signal: the workers that what is in the system right now calls for.

    By Little's law the requests in the system (queued, plus running and waiting in the engines)
    are the arrival rate times the time each spends there, QPS·T, so ⌈in system / c⌉ is the
    planning formula above evaluated on live numbers, with c the requests one worker serves at
    once (its batch width by default). Draining and dead workers are not counted as capacity."""

    queued: int
    running: int
    waiting: int
    per_worker: int
    workers: int

    @property
    def in_system(self) -> int:
        return self.queued + self.running + self.waiting

    @property
    def desired(self) -> int:
        return math.ceil(self.in_system / max(self.per_worker, 1)) if self.in_system else 0


def scale_signal(statuses: list[dict], queued: int, per_worker: int) -> ScaleSignal:
    serving = [s for s in statuses if not s.get("draining")]
    return ScaleSignal(queued=queued, running=sum(int(s.get("running", 0)) for s in statuses),
                       waiting=sum(int(s.get("waiting", 0)) for s in statuses), per_worker=per_worker,
                       workers=len(serving))
