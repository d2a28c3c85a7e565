"""The cancel listener: a gateway cancels a request by setting its flag (`redis_keys.cancelled`) and
publishing its id on `redis_keys.CANCEL_CHANNEL`; every worker hears it, and the one holding the request
stops it in its engine (which frees its KV memory at the next step). A request cancelled before a
worker held it is caught by the flag instead (serving.py reads it before and after the claim).

Its thread (`brigade-cancels`) subscribes again after every lost connection, pausing as the other
Redis clients do through an outage, until the worker stops.
"""
from __future__ import annotations

import logging
import threading
from typing import Callable, Container

import redis

from ops.core import redis_clients, redis_keys

log = logging.getLogger("brigade.worker")

# How long one wait for a message lasts: the longest the thread takes to notice it must stop.
POLL_S = 0.5


class CancelListener:
    def __init__(self, client: redis.Redis, held: Container[str], cancel: Callable[[str], None],
                 stop: threading.Event):
        self.redis = client
        self.held = held  # the ids this worker holds: only those are its to cancel
        self.cancel = cancel  # Engine.cancel
        self.stop = stop
        self.thread = threading.Thread(target=self.run, name="brigade-cancels", daemon=True)

    def run(self) -> None:
        while not self.stop.is_set():
            try:
                # Each lost subscription starts a new run of retries (the pause from its first step).
                pubsub = redis_clients.outage_retry().call_with_retry(
                    self._subscribe, self._lost, with_failure_count=True)
            except redis.RedisError:
                return  # stopping
            try:
                while not self.stop.is_set():
                    message = pubsub.get_message(timeout=POLL_S)
                    if message and message["type"] == "message":
                        self._heard(message["data"])
            except redis.RedisError as exc:
                log.warning("event=cancel_listener_error error=%r", exc)

    def _heard(self, rid: str) -> None:
        if rid in self.held:
            log.info("event=cancel request_id=%s", rid)
            self.cancel(rid)

    def _subscribe(self):
        pubsub = self.redis.pubsub(ignore_subscribe_messages=True)
        pubsub.subscribe(redis_keys.CANCEL_CHANNEL)
        return pubsub

    def _lost(self, exc: redis.RedisError, failures: int) -> None:
        if self.stop.is_set():
            raise exc
        log.warning("event=cancel_listener_error error=%r delay_s=%.2f", exc, redis_clients.outage_pause_s(failures))
