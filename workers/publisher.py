"""Token events out of a worker: after each engine step, one fenced round trip for the whole batch.

Per event (inside ops/core/lua/publish.lua, see claims.py): PUBLISH to the owning gateway's reply channel
(live delivery) and XADD to the request's capped stream (the replay log, with a TTL), unless the
worker's claim on the request was taken over. While Redis is unreachable the events wait here, in
order, and go out with the next step or heartbeat once it answers again.

A Sentinel failover can lose the last writes the old primary acknowledged (replication is
asynchronous), the tail of a replay log among them. So the publisher keeps every event of each
request until the request's last event is logged, and when publish.lua reports a gap (the log holds
fewer tokens than the next event follows) it sends the missing ones again, in order, at once. The
gateway drops any index it has already forwarded, so a client sees each token once.

`ReplyPublisher` is the worker's one door to all this, from any thread: it settles the requests
whose last event went out (their task threads return then, not before) and hands the fenced ones
to whoever drops them. `StepPump` takes the engine's steps to it on a thread of its own, so that
the engine computes its next step during a step's round trip instead of after it.
"""
from __future__ import annotations

import logging
import queue
import threading
from typing import Callable

import redis

from ops.core.messages import ReplyEvent
from workers.claims import ClaimStore
from workers.inflight import InFlight

log = logging.getLogger("brigade.worker")

# Events held through an outage before giving up on them: by then the heartbeat has long expired
# and the reaper has handed these requests to another worker, so they would be fenced anyway.
MAX_PENDING_EVENTS = 200_000


# Rounds of resending a lost tail within one publish: one is enough unless Redis fails over again
# in between; the rest waits for the next step.
MAX_REFILL_ROUNDS = 3

Positioned = tuple[str, ReplyEvent, int | None]  # reply channel, event, position (publish.lua)


class TokenPublisher:
    """Not thread-safe: ReplyPublisher calls it under its lock (`forget` excepted)."""

    def __init__(self, claims: ClaimStore):
        self.claims = claims
        self._pending: list[Positioned] = []
        self._failing = False
        self._sent: dict[str, list[Positioned]] = {}  # request id -> its events so far, until it ends
        self.refilled = 0  # events sent again after a failover lost them (a counter for tests and logs)

    def _positioned(self, channel: str, event: ReplyEvent) -> Positioned:
        """The event with its position in the request's log, remembered until the request ends."""
        history = self._sent.setdefault(event.request_id, [])
        if event.type == "token":
            position = event.index
        else:  # a last event follows the tokens this worker sent (unknown if it sent none)
            position = next((e.index + 1 for _, e, _ in reversed(history) if e.type == "token"), None)
        item = (channel, event, position)
        history.append(item)
        return item

    def publish(self, events: list[tuple[str, ReplyEvent]]) -> set[str] | None:
        """Send (reply_channel, event) pairs, after any still waiting. Returns the fenced request
        ids, or None when Redis did not answer (the events are kept for the next call)."""
        self._pending.extend(self._positioned(channel, event) for channel, event in events)
        if not self._pending:
            return set()
        try:
            result = self.claims.publish(self._pending)
            fenced = set(result.fenced)
            for _ in range(MAX_REFILL_ROUNDS):
                if not result.gaps:
                    break
                result = self.claims.publish(self._refill(result.gaps))
                fenced |= result.fenced
        except redis.RedisError as exc:
            if not self._failing:
                log.warning("event=publish_failed pending=%d error=%r", len(self._pending), exc)
            self._failing = True
            if len(self._pending) > MAX_PENDING_EVENTS:
                abandoned = {e.request_id for _, e, _ in self._pending}  # (channel, event, position)
                self._pending = []
                log.error("event=publish_abandoned requests=%d", len(abandoned))
                return abandoned
            return None
        if self._failing:
            log.info("event=publish_recovered events=%d", len(self._pending))
            self._failing = False
        for _, event, _ in self._pending:  # a request that ended, or was fenced, needs no memory
            if (event.type != "token" and event.request_id not in result.gaps) or event.request_id in fenced:
                self._sent.pop(event.request_id, None)
        # Still gapped (Redis failing over again): the missing events wait for the next call.
        self._pending = self._refill(result.gaps) if result.gaps else []
        return fenced

    def _refill(self, gaps: dict[str, int]) -> list[Positioned]:
        """Each gapped request's events from the first token its log lacks, in order."""
        out: list[Positioned] = []
        for rid, logged in gaps.items():
            missing = [item for item in self._sent.get(rid, []) if item[2] is None or item[2] >= logged]
            log.warning("event=log_refill request_id=%s logged=%d resent=%d", rid, logged, len(missing))
            self.refilled += len(missing)
            out += missing
        return out

    def forget(self, rid: str) -> None:
        """The request left this worker without a last event of its own (handed back, dropped).
        Called with or without ReplyPublisher's lock: one dict pop, which the interpreter makes atomic."""
        self._sent.pop(rid, None)

    @property
    def waiting(self) -> int:
        return len(self._pending)


class ReplyPublisher:
    """Every reply event of this worker goes out here: a step's (engine thread), a refusal or a
    last word without the engine (task threads), and those waiting through an outage (retried by
    the heartbeat thread). A request's task returns only once its last event is out."""

    def __init__(self, tokens: TokenPublisher, on_fenced: Callable[[str], None]):
        self.tokens = tokens
        # Called under the lock for each request whose claim was taken over: no event of it goes out
        # after the one that found it fenced.
        self.on_fenced = on_fenced
        self._unsettled: list[InFlight] = []  # ended, but their last event is not in Redis yet
        self.requests_served = 0
        # Guards `tokens` (not thread-safe), `_unsettled` and `requests_served`; taken by the engine
        # thread after each step, by task threads and by the heartbeat thread. The held requests'
        # lock may be taken inside it (on_fenced), never the other way round.
        self._publishing = threading.Lock()

    def publish(self, events: list[tuple[str, ReplyEvent]], ended: list[InFlight]) -> None:
        """Publish (after whatever waits); the `ended` requests settle once their last event is out."""
        with self._publishing:
            self._unsettled.extend(ended)
            fenced = self.tokens.publish(events)
            if fenced is None:
                return  # Redis is away: the heartbeat thread retries
            for rid in fenced:
                self.on_fenced(rid)
            for entry in self._unsettled:
                self.requests_served += 1
                entry.finished.set()
            self._unsettled = []

    def retry(self) -> None:
        """Send what waits for Redis, if anything does."""
        if self.tokens.waiting or self._unsettled:
            self.publish([], [])



class StepPump:
    """Each engine step's events go out on this thread (`brigade-publish`), in the order the steps
    came, while the engine thread goes on to its next step: the round trip to Redis and the events'
    JSON overlap the next step's products, which let go of the GIL (on the 2-core AVX2 machine the
    served one-stream rate did not move measurably with it: docs/benchmarks.md). Steps that queued while a publish was out go in the
    next one together. Once `stop` is set, the thread sends what is queued and ends."""

    def __init__(self, replies: ReplyPublisher, stop: threading.Event):
        self.replies = replies
        self._stop = stop
        self._steps: queue.SimpleQueue[tuple[list[tuple[str, ReplyEvent]], list[InFlight]]] = queue.SimpleQueue()
        self.thread = threading.Thread(target=self._run, name="brigade-publish", daemon=True)

    def put(self, events: list[tuple[str, ReplyEvent]], ended: list[InFlight]) -> None:
        """A step's events and the requests it ended (engine thread)."""
        self._steps.put((events, ended))

    def _run(self) -> None:
        while True:
            try:
                events, ended = self._steps.get(timeout=0.2)
            except queue.Empty:
                if self._stop.is_set():
                    return
                continue
            events, ended = list(events), list(ended)
            while True:
                try:
                    more_events, more_ended = self._steps.get_nowait()
                except queue.Empty:
                    break
                events += more_events
                ended += more_ended
            try:
                self.replies.publish(events, ended)
            except Exception:  # a bug, not Redis (publish keeps Redis's errors): the worker reports itself dead
                log.exception("event=publish_thread_failed events=%d", len(events))
                raise
