"""The reaper: when a worker's heartbeat expires, its requests go to another worker.

Every `reaper_interval_s` it reads the running claims (request -> owner) and checks each owner's
heartbeat key. For each request of an owner whose key is gone, the reap script (ops/core/lua/reap.lua)
atomically bumps the epoch, which fences the old owner should it still be alive (a stall, not a
crash), and then either frees the request for a new claim, when the reaper sends it to the queue
again, or, after max_attempts, buries it in the dead-letter list and tells its client.

Several reapers may run at once: the script lets exactly one of them act on each request.
The next worker reads the tokens already sent from the replay log when it claims the request
(rather than the reaper copying them into the message): at that moment nobody else can write to
the log, so what it reads is complete.
"""
from __future__ import annotations

import logging
import signal
import threading
import time
import uuid

import redis

from ops.core import redis_clients, redis_keys
from ops.rollout.canary import Controller
from ops.core.queue import QueueSender
from ops.core.settings import Settings
from workers.claims import ClaimStore
from workers.queue_sweep import QueueSweep

log = logging.getLogger("brigade.reaper")


class Reaper:
    def __init__(self, settings: Settings, client: redis.Redis | None = None):
        self.settings = settings
        self.redis = client or redis_clients.client(settings.redis_url)
        self.claims = ClaimStore.from_settings(self.redis, settings)
        self.sender = QueueSender(settings)
        self.queues = QueueSweep(self.redis, self.claims, self.sender, settings)
        self._up_since: float | None = None  # when this reaper last found Redis answering after a failure
        self._run_id: str | None = None  # the Redis server that answered the last pass
        # Canaries are stepped by whichever controller holds their lease: a gateway's, or this one,
        # so canaries keep their objectives when no gateway runs (ops/rollout/canary.py).
        self.canaries = Controller(self.redis, f"reaper:{uuid.uuid4().hex[:12]}", settings)
        self._canary_at = 0.0

    def sweep(self) -> dict[str, str]:
        """One pass; returns what was done: request id -> requeue | buried | unclaimed (a message
        that left the queue for nobody: workers/queue_sweep.py)."""
        if not self._heartbeats_trustworthy():
            return {}
        done = self._sweep_claims()
        done.update(self.queues.sweep())
        return done

    def _sweep_claims(self) -> dict[str, str]:
        owners = self.claims.owners()
        if not owners:
            return {}
        alive = self.claims.alive(set(owners.values()))
        done: dict[str, str] = {}
        for rid, owner in owners.items():
            if owner in alive:
                continue
            outcome = self.claims.reap(rid, owner)  # "buried": bury.lua also told the client
            if outcome == "skip":
                continue
            if outcome == "requeue":
                queued = self.claims.queued_request(rid)
                if queued is None:
                    log.warning("event=reaped_without_request request_id=%s", rid)
                    continue
                self.sender.send(queued)  # to its own version's queue (QueuedRequest.version)
                log.info("event=reaped request_id=%s dead_owner=%s outcome=%s served=%s", rid, owner, outcome,
                         redis_keys.served(queued.model, queued.version))
            else:
                log.info("event=reaped request_id=%s dead_owner=%s outcome=%s", rid, owner, outcome)
            done[rid] = outcome
        return done

    def _heartbeats_trustworthy(self) -> bool:
        """Right after Redis (re)started, or after we lost it, a missing heartbeat says nothing:
        live workers have not had a beat's time to write again. Reaping then would move every
        running request and charge it an attempt."""
        settle = self.settings.heartbeat_ttl_s + self.settings.heartbeat_interval_s
        server = self.redis.info("server")
        uptime = server.get("uptime_in_seconds", settle)
        # Another server answering (a Sentinel failover promoted a replica, perhaps without an error
        # on this connection) is a Redis that lost what was written last: heartbeats among it.
        if server.get("run_id") != self._run_id:
            self._run_id, self._up_since = server.get("run_id"), None
        if self._up_since is None:
            self._up_since = time.monotonic()
        return uptime >= settle and time.monotonic() - self._up_since >= settle

    def run(self, stop: threading.Event) -> None:
        log.info("event=reaper_started interval_s=%.2f", self.settings.reaper_interval_s)

        def redis_lost(exc: redis.RedisError, failures: int) -> None:
            self._up_since = None
            if stop.is_set():
                raise exc
            log.warning("event=reaper_redis_error error=%r delay_s=%.2f", exc,
                        redis_clients.outage_pause_s(failures, first_s=0.5))

        while not stop.is_set():
            try:
                redis_clients.outage_retry(first_s=0.5).call_with_retry(self.sweep, redis_lost, with_failure_count=True)
                self._step_canaries()
            except redis.RedisError:
                return  # stopping
            except Exception:  # a bad record must not end the reaper
                log.exception("event=reaper_error")
            stop.wait(self.settings.reaper_interval_s)
        try:
            self.canaries.release()
        except redis.RedisError:
            pass

    def _step_canaries(self) -> None:
        now = time.monotonic()
        if now - self._canary_at < self.settings.canary_tick_s:
            return
        self._canary_at = now
        try:
            self.canaries.tick()
        except redis.RedisError as exc:  # Redis away: the sweep's retry waits for it; canaries wait too
            log.debug("event=canary_tick_failed error=%r", exc)


def run_reaper(settings: Settings) -> None:
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    try:
        Reaper(settings).run(stop)
    except KeyboardInterrupt:
        pass
