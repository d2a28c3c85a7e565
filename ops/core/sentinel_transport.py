"""kombu's Redis Sentinel transport, finding the primary through every sentinel after any failover.

kombu reads the sentinels from the broker URL's `;`-separated `sentinel://` alternates. But when a
connection fails, kombu's failover switches to the next alternate and re-reads the transport from
that URL's scheme (kombu.connection.Connection.switch), dropping the transport the app named in
`broker_transport`: a worker then ran on kombu's own transport, without Brigade's fixes
(workers/transport.py), and died at the next failover (AttributeError while restoring unacked
messages; seen in `brigade bench soak --kill-redis-primary 3`). So Brigade gives kombu one broker
URL and the sentinels as the transport option `sentinel_hosts`; redis-py's Sentinel, which kombu
builds from them, asks each in turn, so one URL loses nothing.
"""
from __future__ import annotations

from kombu.transport import redis as kombu_redis


class SentinelChannel(kombu_redis.SentinelChannel):
    from_transport_options = kombu_redis.SentinelChannel.from_transport_options + ("sentinel_hosts",)
    sentinel_hosts: list = []

    def _sentinel_managed_pool(self, asynchronous=False):
        # kombu collects the sentinels from the connection's alternates: present every sentinel
        # as one, for the length of this call (kombu's own method, unchanged, does the rest).
        client = self.connection.client
        given = client.alt
        if self.sentinel_hosts:
            client.alt = [f"sentinel://{h if ':' not in h else f'[{h}]'}:{p}" for h, p in self.sentinel_hosts]
        try:
            return super()._sentinel_managed_pool(asynchronous)
        finally:
            client.alt = given


class SentinelTransport(kombu_redis.SentinelTransport):
    Channel = SentinelChannel
