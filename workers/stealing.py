"""An idle worker takes requests routed to a busy one that did not take them in time.

Prefix routing (gateway/admission/routing.py) puts a request on its chosen worker's own queue. A
worker takes messages while it has free task threads; one that has none (it holds as many
requests as its threads) leaves them waiting there. This thread (`brigade-steal`), on a worker
with free rows and nothing waiting in its engine, looks at the tails of the other live workers'
own queues of its version a few times a second, and moves to its own queue (at its pop end) each
message that stayed at a tail for `steal_after_s`: a request never queues behind one slow worker
while another is idle. The move is one Lua script (ops/core/lua/steal.lua) that checks the
message's task id is still the one seen, so no clock is compared and two thieves never take the
same message. A stolen request costs its prefill, the price of not waiting.
"""
from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

import redis

from ops.core import redis_keys, roster, scripts
from ops.core.settings import Settings

log = logging.getLogger("brigade.worker")

STEPS = [i for i, step in enumerate(redis_keys.PRIORITY_STEPS) if step != redis_keys.BATCH_STEP]  # interactive steps
PEERS_EVERY_S = 1.0  # how often the live peers are read again
MOST_PER_LOOK = 4


class Stealing:
    def __init__(self, client: redis.Redis, settings: Settings, instance: str, free_slots: Callable[[], int],
                 on_stolen: Callable[[int], None], stop: threading.Event):
        self.redis = client
        self.settings = settings
        self.instance = instance
        self.free_slots = free_slots  # requests this worker could start now (0: busy)
        self.on_stolen = on_stolen
        self.stop = stop
        self.look_s = max(settings.steal_after_s / 4, 0.02)
        self._steal = scripts.register(client, "steal")
        self._own = redis_keys.worker_queue_lists(settings.model_name, settings.model_version, instance)
        self._peers: list[str] = []
        self._peers_at = 0.0
        self._seen: dict[str, tuple[str, float]] = {}  # source list -> (task id at its tail, first seen)
        self.thread = threading.Thread(target=self.run, name="brigade-steal", daemon=True)

    def _read_peers(self) -> list[str]:
        now = time.monotonic()
        if now - self._peers_at >= PEERS_EVERY_S:
            self._peers_at = now
            self._peers = [s["instance"] for s in roster.live_workers(self.redis)
                           if s.get("instance") not in (None, self.instance) and s.get("model") == self.settings.model_name
                           and (s.get("version") or "") == self.settings.model_version]
        return self._peers

    def look(self) -> int:
        """One look at the peers' tails; returns how many messages it moved here."""
        peers = self._read_peers()
        budget = min(self.free_slots(), MOST_PER_LOOK) if peers else 0
        if budget <= 0:
            self._seen.clear()
            return 0
        pairs: list[str] = []
        for peer in peers:
            theirs = redis_keys.worker_queue_lists(self.settings.model_name, self.settings.model_version, peer)
            for i in STEPS:
                pairs += [self._own[i], theirs[i]]
        sources = pairs[1::2]
        now = time.monotonic()
        expected = []
        for source in sources:
            seen = self._seen.get(source)
            expected.append(seen[0] if seen and now - seen[1] >= self.settings.steal_after_s else "")
        moved, *tails = self._steal(keys=pairs, args=[budget, *expected])
        self._seen = {source: (tail, self._seen[source][1] if self._seen.get(source, ("",))[0] == tail else now)
                      for source, tail in zip(sources, tails) if tail}
        if moved:
            log.info("event=routed_requests_stolen count=%d", moved)
            self.on_stolen(int(moved))
        return int(moved)

    def run(self) -> None:
        while not self.stop.is_set():
            try:
                self.look()
            except redis.RedisError as exc:  # Redis away: routed work waits with everything else
                log.debug("event=steal_failed error=%r", exc)
                self._seen.clear()
            self.stop.wait(self.look_s)
