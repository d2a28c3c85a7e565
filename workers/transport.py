"""The worker's broker transport: kombu's Redis transport, kept alive across a broker restart.

The worker app names it with `broker_transport="workers.transport:Transport"`, kombu's supported
way to choose a transport class, so nothing outside the worker's own connections changes: kombu's
`kombu.transport.redis.QoS` stays as kombu wrote it for every other user in the process.

Why (seen with Celery 5.7 / kombu 5.7 when redis-server restarts under a running worker; the Redis
restart test in tests/test_failover.py): the consumer calls connection.collect() and then close(),
which leaves the old channel without a connection. Two things then touch that channel and raise
AttributeError, which Celery treats as an unrecoverable error, so the worker stops instead of
reconnecting:

1. close() restores the channel's unacked messages through it;
2. a task that was running across the outage finishes and acks its message through it.

Brigade needs neither: a request's claim record and the reaper decide who runs it, and a message
that was never acked is redelivered by Celery after the visibility timeout, when its claim (done,
or held by a live worker) makes the duplicate a no-op.
"""
from __future__ import annotations

import logging
import time

from kombu.transport import redis as kombu_redis
from kombu.transport import virtual
from kombu.utils.json import dumps

from ops.core import redis_keys, sentinel_transport
from ops.core.queue import RID_HEADER

# The transport option that names the worker instance receiving messages (workers/app.py sets it).
TAKER_OPTION = "brigade_taker"

log = logging.getLogger("brigade.worker")


class QoS(kombu_redis.QoS):
    """kombu's Redis ack emulation, minus the two steps that need a channel a lost connection took."""

    # Fix 1: closing a channel does not push its unacked messages back; redelivery after the
    # visibility timeout does that, through a live connection.
    restore_at_shutdown = False

    def append(self, message, delivery_tag):
        """kombu records a delivered message as unacked; in the same transaction this worker marks
        its request taken (redis_keys.TAKEN), so the reaper learns the moment the message has left the
        queue for us, and not only once Celery's strategy has run (a kill in between was a request
        nobody could find for unclaimed_after_s: docs/reliability.md)."""
        taker = self.channel.connection.client.transport_options.get(TAKER_OPTION)
        rid = (message.headers or {}).get(RID_HEADER)
        if not taker or not rid:
            return super().append(message, delivery_tag)
        delivery = message.delivery_info
        with self.pipe_or_acquire() as pipe:  # kombu's own two writes, and ours, in one MULTI
            pipe.hset(redis_keys.TAKEN, rid, taker) \
                .zadd(self.unacked_index_key, {delivery_tag: time.time()}) \
                .hset(self.unacked_key, delivery_tag, dumps([message._raw, delivery["exchange"], delivery["routing_key"]])) \
                .execute()
        virtual.QoS.append(self, message, delivery_tag)

    def ack(self, delivery_tag):
        if self.channel.connection is None:  # fix 2: the channel was collected after a lost connection
            log.info("event=ack_skipped_on_closed_channel delivery_tag=%s", delivery_tag)
            # The base class's ack only forgets the message in this channel's own bookkeeping; the
            # Redis side (the unacked index) is left for the visibility timeout to redeliver.
            virtual.QoS.ack(self, delivery_tag)
            return
        super().ack(delivery_tag)


class Channel(kombu_redis.Channel):
    QoS = QoS


class Transport(kombu_redis.Transport):
    Channel = Channel


class SentinelChannel(sentinel_transport.SentinelChannel):
    QoS = QoS


class SentinelTransport(sentinel_transport.SentinelTransport):
    """The same fixes on the Sentinel transport (a `redis+sentinel://` BRIGADE_REDIS_URL): a
    failover is a broker connection lost and found again at another address."""

    Channel = SentinelChannel
