"""Two fixes to kombu's Redis transport for a worker that loses its broker connection.

Seen with Celery 5.7 / kombu 5.7 when redis-server restarts under a running worker (the Redis
restart test in tests/test_failover.py): the consumer calls connection.collect() and then
close(), which leaves the old channel without a connection. Two things then touch that channel
and raise AttributeError, which Celery treats as an unrecoverable error, so the worker stops
instead of reconnecting:

1. close() restores the channel's unacked messages through it;
2. a task that was running across the outage finishes and acks its message through it.

Brigade needs neither: a request's claim record and the reaper decide who runs it, and a message
that was never acked is redelivered by Celery after the visibility timeout, when its claim
(done, or held by a live worker) makes the duplicate a no-op.
"""
from __future__ import annotations

import logging

from kombu.transport import redis as kombu_redis

log = logging.getLogger("brigade.worker")


def apply() -> None:
    kombu_redis.QoS.restore_at_shutdown = False
    if getattr(kombu_redis.QoS, "_brigade_patched", False):
        return
    original_ack = kombu_redis.QoS.ack

    def ack(self, delivery_tag):
        if self.channel.connection is None:  # the channel was collected after a lost connection
            log.info("event=ack_skipped_on_closed_channel delivery_tag=%s", delivery_tag)
            self._delivered.pop(delivery_tag, None)
            return
        original_ack(self, delivery_tag)

    kombu_redis.QoS.ack = ack
    kombu_redis.QoS._brigade_patched = True
