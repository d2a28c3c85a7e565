"""Token events out of a worker: after each engine step, one Redis pipeline for the whole batch.

Per event: PUBLISH to the owning gateway's reply channel (live delivery) and XADD to the
request's capped stream (the replay log), with a TTL so that a forgotten stream expires.
"""
from __future__ import annotations

import redis

from ops import keys
from ops.messages import ReplyEvent
from ops.settings import Settings


class TokenPublisher:
    def __init__(self, client: redis.Redis, settings: Settings):
        self.redis = client
        self.maxlen = settings.stream_maxlen
        self.ttl = settings.stream_ttl_s

    def publish(self, events: list[tuple[str, ReplyEvent]]) -> None:
        """Send (reply_channel, event) pairs in one round trip."""
        if not events:
            return
        pipe = self.redis.pipeline(transaction=False)
        for channel, event in events:
            data = event.model_dump_json(exclude_none=True)
            pipe.publish(channel, data)
            stream = keys.stream(event.request_id)
            pipe.xadd(stream, {"event": data}, maxlen=self.maxlen, approximate=True)
            if event.type != "token" or event.index == 0:
                pipe.expire(stream, self.ttl)
        pipe.execute()
