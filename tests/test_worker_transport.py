"""The worker's broker transport (workers/transport.py): chosen by the worker's app through
`broker_transport`, leaving kombu's own Redis transport as kombu wrote it, and keeping a worker
whose connection was collected (as Celery does after a lost broker) from touching that channel.
The whole worker across a real redis-server restart is tests/test_failover.py's Redis restart test."""
from __future__ import annotations

import json
import logging
import subprocess
import sys
import uuid

from kombu.transport import redis as kombu_redis

# Run in a fresh interpreter: in this one another test may have imported the worker already.
_KOMBU_QOS_BEFORE_AND_AFTER = """
import json
from kombu.transport import redis as kombu_redis

def qos():
    return {name: repr(value) for name, value in vars(kombu_redis.QoS).items()}

before = qos()
import workers.app, workers.tasks, workers.flower  # everything a worker or Flower process imports
print(json.dumps({"before": before, "after": qos()}))
"""


def test_importing_the_worker_leaves_kombus_redis_qos_unchanged():
    out = subprocess.run([sys.executable, "-c", _KOMBU_QOS_BEFORE_AND_AFTER], capture_output=True, text=True,
                         timeout=300, check=True).stdout
    seen = json.loads(out.splitlines()[-1])
    assert seen["after"] == seen["before"]
    assert "restore_at_shutdown" in seen["after"] and "ack" in seen["after"]  # the attributes a patch would change


def test_the_worker_app_connects_through_brigades_transport():
    from workers import transport
    from workers.app import app

    chosen = app.connection_for_write().get_transport_cls()
    assert chosen is transport.Transport
    assert issubclass(chosen, kombu_redis.Transport) and chosen.driver_type == "redis"  # Celery's redis paths apply
    assert chosen.Channel.QoS is transport.QoS and issubclass(transport.QoS, kombu_redis.QoS)


def test_a_collected_channel_neither_restores_nor_acks_and_the_message_waits_for_redelivery(redis_server, caplog):
    from workers.app import app

    client = redis_server.client
    client.flushall()
    name = f"transport-test-{uuid.uuid4().hex[:8]}"
    conn = app.connection_for_write(url=redis_server.url)
    queue = conn.SimpleQueue(name)
    queue.put({"request_id": "r1"}, serializer="json")
    message = queue.get(timeout=10)
    channel = message.channel
    assert client.hlen(channel.unacked_key) == 1

    # What Celery's consumer does after a lost connection: collect, which closes the channel.
    conn.collect()
    assert channel.connection is None
    assert client.llen(name) == 0, "closing the channel must not push its unacked message back"

    with caplog.at_level(logging.INFO, logger="brigade.worker"):
        message.ack()  # a task that ran across the outage finishing: must not raise
    assert "event=ack_skipped_on_closed_channel" in caplog.text
    # Still unacked in Redis, so kombu redelivers it after the visibility timeout.
    assert client.hlen(channel.unacked_key) == 1


def test_a_rediss_broker_url_keeps_its_tls_through_the_named_transport():
    # kombu turns TLS on for rediss:// when the URL's scheme picks the transport; naming one must not
    # turn it off (ops/core/queue.make_app asks for it as kombu would).
    from ops.core.queue import make_app
    from workers.app import TRANSPORT

    for url in ("rediss://broker.example:6380/0", "rediss://broker.example:6380/0?ssl_cert_reqs=required",
                "redis://broker.example:6379/0"):
        stock = make_app(url, set_as_current=False).connection_for_write()
        ours = make_app(url, transport=TRANSPORT, set_as_current=False).connection_for_write()
        assert ours.get_transport_cls().__module__ == "workers.transport"
        assert (ours.ssl, ours.hostname, ours.port) == (stock.ssl, stock.hostname, stock.port), url
    assert make_app("rediss://broker.example:6380/0", transport=TRANSPORT,
                    set_as_current=False).connection_for_write().ssl  # TLS, not the clear
