"""The reaper: when a worker's heartbeat expires, its requests go to another worker.

Every `reaper_interval_s` it reads the running claims (request -> owner) and checks each owner's
heartbeat key. For each request of an owner whose key is gone, the reap script (claims.py)
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

import redis

from ops.settings import Settings
from workers.app import enqueue
from workers.claims import ClaimStore, worker_failed

log = logging.getLogger("brigade.reaper")


class Reaper:
    def __init__(self, settings: Settings, client: redis.Redis | None = None):
        self.settings = settings
        self.redis = client or redis.Redis.from_url(settings.redis_url, socket_timeout=5, socket_connect_timeout=2)
        self.claims = ClaimStore.from_settings(self.redis, settings)
        self.requeued = 0
        self.buried = 0

    def sweep(self) -> dict[str, str]:
        """One pass; returns what was done: request id -> requeue | buried."""
        owners = self.claims.owners()
        if not owners:
            return {}
        alive = self.claims.alive(set(owners.values()))
        done: dict[str, str] = {}
        for rid, owner in owners.items():
            if owner in alive:
                continue
            outcome = self.claims.reap(rid, owner)
            if outcome == "skip":
                continue
            queued = self.claims.queued_request(rid)
            if queued is None:
                log.warning("event=reaped_without_request request_id=%s", rid)
                continue
            if outcome == "requeue":
                enqueue(queued)
                self.requeued += 1
            else:
                attempts = self.settings.max_attempts
                self.claims.publish_unfenced(queued.reply_channel, worker_failed(rid, attempts))
                self.buried += 1
            log.info("event=reaped request_id=%s dead_owner=%s outcome=%s", rid, owner, outcome)
            done[rid] = outcome
        return done

    def run(self, stop: threading.Event) -> None:
        log.info("event=reaper_started interval_s=%.2f", self.settings.reaper_interval_s)
        delay = self.settings.reaper_interval_s
        while not stop.is_set():
            try:
                self.sweep()
                delay = self.settings.reaper_interval_s
            except redis.RedisError as exc:
                log.warning("event=reaper_redis_error error=%r", exc)
                delay = min(max(delay * 2, 0.5), 2.0)
            except Exception:  # a bad record must not end the reaper
                log.exception("event=reaper_error")
            stop.wait(delay)


def run_reaper(settings: Settings) -> None:
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    try:
        Reaper(settings).run(stop)
    except KeyboardInterrupt:
        pass
