"""The worker's heartbeat: its status key (`redis_keys.worker`), rewritten every `heartbeat_interval_s`
with a TTL, and its place in the live-worker registry (ops/core/roster.py). The key's expiry is what
tells the reaper to hand this worker's requests to another one.

A beat vouches for progress, not for a live process: while the engine thread has not come round
its loop for `engine_stall_s`, or has died, the heartbeat stops beating, so that a wedged engine's
requests move on instead of waiting forever. Its thread is `brigade-heartbeat`.
"""
from __future__ import annotations

import logging
import threading
import time
from typing import Callable, Protocol, Sized

import redis

from ops.core import redis_keys, roster
from ops.core.settings import Settings

log = logging.getLogger("brigade.worker")


class EngineProgress(Protocol):
    """What the heartbeat reads of the engine (Engine has both, written by its thread)."""

    loop_at: float  # monotonic: when the engine thread last came round its loop
    tokens_generated: int


class Heartbeat:
    def __init__(self, client: redis.Redis, settings: Settings, instance: str, progress: EngineProgress,
                 engine_alive: Callable[[], bool], status: Callable[[float], dict], held: Sized,
                 stop: threading.Event, on_beat: Callable[[], None] = lambda: None):
        self.redis = client
        self.instance = instance
        self.interval_s = settings.heartbeat_interval_s
        self.stall_s = settings.engine_stall_s
        self.ttl_ms = redis_keys.worker_ttl_ms(settings)
        self.progress = progress
        self.engine_alive = engine_alive  # whether the engine thread still runs
        self.status = status  # the worker's status at a tokens/s rate: the key's JSON
        self.held = held  # the requests it vouches for (counted in the stall's log line)
        self.stop = stop
        # Rides on each beat the heartbeat makes: the publisher's retry of events waiting for Redis.
        self.on_beat = on_beat
        # The engine made no progress for stall_s: we do not vouch for it. Written by the heartbeat
        # thread alone (task threads read it, through `vouching`).
        self.stalled = False
        self.thread = threading.Thread(target=self.run, name="brigade-heartbeat", daemon=True)

    @property
    def vouching(self) -> bool:
        """Whether the heartbeat thread beats now (as it would decide)."""
        return not self.stalled and self.engine_alive()

    def renew_if_lapsed(self) -> bool:
        """Back from a cut from Redis, our key has expired and the heartbeat thread beats again only
        on its next turn: a claim made before then would be reaped at once (no heartbeat), and our
        run of it fenced. Before a claim, beat at once if we vouch and the key is gone. Returns
        whether it beat."""
        if self.vouching and not self.redis.exists(redis_keys.worker(self.instance)):
            self.record(0.0)
            return True
        return False

    def record(self, tokens_per_s: float, prune: bool = False) -> None:
        """Our status, with the TTL whose expiry tells the reaper we are gone."""
        pipe = self.redis.pipeline(transaction=False)
        roster.record_beat(pipe, self.instance, self.status(tokens_per_s), self.ttl_ms, time.time(), prune=prune)
        pipe.execute()

    def run(self) -> None:
        last_tokens, last_time = self.progress.tokens_generated, time.monotonic()
        beats = 0
        while not self.stop.is_set():
            if not self.engine_alive():
                # No engine, no progress: stop beating so that the reaper hands our requests on.
                log.error("event=engine_thread_dead heartbeat=stopped")
                return
            now, tokens = time.monotonic(), self.progress.tokens_generated
            rate = (tokens - last_tokens) / max(now - last_time, 1e-6)
            last_tokens, last_time = tokens, now
            silent = now - self.progress.loop_at
            if silent > self.stall_s:
                # A live process whose engine makes no progress must not vouch for its requests:
                # the key expires, the reaper fences us and continues them elsewhere.
                if not self.stalled:
                    log.error("event=engine_stalled seconds=%.1f heartbeat=stopped requests=%d", silent,
                              len(self.held))
                self.stalled = True
                self.stop.wait(self.interval_s)
                continue
            if self.stalled:
                log.warning("event=engine_recovered heartbeat=resumed")
                self.stalled = False
            try:
                self.record(rate, prune=beats % roster.PRUNE_EVERY == 0)
                beats += 1
            except redis.RedisError as exc:
                log.warning("event=heartbeat_failed error=%r", exc)
            self.on_beat()
            self.stop.wait(self.interval_s)
