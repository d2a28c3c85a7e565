"""A Celery task's request, from its claim to its end, on the task's own thread.

`serve()` skips a request cancelled while it was queued, claims it (claims.py), continues it from
its replay log when an earlier worker already sent tokens, hands it to the engine and blocks until
it ends, so that the Celery pool's concurrency bounds how many requests one worker holds. What it
becomes on the way in and out is inflight.py's; its events after that are the engine loop's.
"""
from __future__ import annotations

import logging
import threading
import time
from collections import Counter

import redis

from engine import Engine, RequestRejected, SequenceUpdate
from ops.core import redis_clients, redis_keys
from ops.core.messages import QueuedRequest, ReplyEvent
from workers.claims import MINE, Claim, ClaimStore
from workers.handover import Handover
from workers.heartbeat import Heartbeat
from workers.held import HeldRequests
from workers.inflight import InFlight, done_reply, engine_request
from workers.metrics import WorkerMetrics
from workers.publisher import ReplyPublisher

log = logging.getLogger("brigade.worker")

# How often a task waits to see whether the engine has let go of a stale run of its request.
LET_GO_POLL_S = 0.01


class Serving:
    def __init__(self, instance: str, worker_name: str, engine: Engine,
                 client: redis.Redis, claims: ClaimStore, held: HeldRequests, replies: ReplyPublisher,
                 handover: Handover, heartbeat: Heartbeat, metrics: WorkerMetrics, stop: threading.Event):
        self.instance = instance
        self.worker_name = worker_name
        self.engine = engine
        self.redis = client  # the cancel flags and the unclaimed list
        self.claims = claims
        self.held = held
        self.replies = replies
        self.handover = handover
        self.heartbeat = heartbeat
        self.metrics = metrics
        self.stop = stop  # the worker is stopping: stop waiting out a Redis outage
        # Request id -> how many task threads are in `serve` for it (more than one: it was delivered
        # again while a thread of ours runs it), for telling such a delivery from a lost reply (_adopt).
        self._serving: Counter[str] = Counter()
        self._serving_lock = threading.Lock()

    def serve(self, queued: QueuedRequest) -> str:
        """Run one request to its end; returns how it ended (finish reason, refusal code or skip)."""
        rid = queued.request_id
        with self._serving_lock:
            self._serving[rid] += 1
        try:
            return self._serve(queued)
        finally:
            with self._serving_lock:
                self._serving[rid] -= 1
                if not self._serving[rid]:
                    del self._serving[rid]

    def _serve(self, queued: QueuedRequest) -> str:
        rid = queued.request_id
        if self.held.draining:
            self.handover.send_back(queued)
            return "handed_back"
        claim = self._retrying(lambda: self._claim(rid))
        if claim is not None and claim.outcome == MINE:
            claim = self._adopt(rid, claim)
        if claim is None:
            # A client following the request (resume) must learn that it ended.
            event = ReplyEvent(type="done", request_id=rid, finish_reason="cancelled")
            self._retrying(lambda: self.claims.publish_unfenced(queued.reply_channel, event))
            self.metrics.finished("cancelled", {}, None)
            return "cancelled"
        if claim.outcome == "dead":  # buried (bury.lua), which also told the client
            log.warning("event=dead_lettered request_id=%s attempts=%d", rid, claim.attempts)
            self.metrics.dead_letters.inc()
            self.metrics.failed("worker_failed")
            return "dead"
        if claim.outcome != "claimed":
            # Done, gone, or held by a live worker: a duplicate delivery, harmless once skipped.
            log.info("event=claim_skipped request_id=%s outcome=%s", rid, claim.outcome)
            return claim.outcome
        entry = InFlight(queued, added_at=time.time(), epoch=claim.epoch)
        # Our own request, reaped while we stalled, came back to us: the old run is stale. Drop it
        # and wait until the engine has let go of it, so none of its tokens carry the new epoch.
        if rid in self.held:
            self.handover.fenced(rid)
        while self.engine.holds(rid) and not self.stop.is_set():
            time.sleep(LET_GO_POLL_S)
        logged = self._retrying(lambda: self.claims.logged_tokens(rid))
        # Epochs follow the clock (claim.lua), so a first run is told by its attempts and its log.
        entry.continued = claim.attempts > 1 or bool(logged)
        # The deadline is for work not yet started; a continued request is finished.
        if not entry.continued and queued.deadline_at is not None and time.time() > queued.deadline_at:
            self._refuse(entry, "deadline_exceeded", "the request's deadline passed while it waited in the queue")
            return "deadline_exceeded"
        if not self.held.register(entry):  # the drain began while we claimed: hand it straight back
            self.handover.hand_back(entry)
            return "handed_back"
        try:
            request = engine_request(entry, logged)
            if request.choices == []:  # every choice ended before the hand-over: only the end is missing
                self._end_without_engine(entry, len(self.engine.encode(request)))
                return entry.finish_reason or "stop"
            self.engine.add_request(request)
        except RequestRejected as refused:
            self.held.forget(rid)
            self._refuse(entry, refused.code, refused.message)
            return refused.code
        except Exception:  # e.g. the tokenizer failing on this input: the client must hear of it
            log.exception("event=request_failed request_id=%s", rid)
            self.held.forget(rid)
            self._refuse(entry, "internal_error", "the worker could not run this request")
            return "internal_error"
        # Every request gets one line at its end (event=request_done); its claim is worth a line of
        # its own only when it continues an earlier worker's run.
        log.log(logging.INFO if entry.continued else logging.DEBUG,
                "event=claimed request_id=%s epoch=%d attempt=%d resumed_tokens=%d", rid, claim.epoch,
                claim.attempts, len(logged))
        if entry.continued:
            self.metrics.failovers.inc()
        # A cancel may have landed between the check in _claim and the registration.
        if self.redis.exists(redis_keys.cancelled(rid)):
            self.engine.cancel(rid)
        entry.finished.wait()
        return entry.finish_reason or "error"

    def _adopt(self, rid: str, claim: Claim) -> Claim:
        """A claim that is already ours. With another of our task threads in `serve` for the request,
        this is a second delivery of it: skipped, as a live owner's would be. With none, it is our
        own claim whose reply was lost (the primary died after running it, and the retry found it
        done on the replica it promoted): we run it at its epoch, or nobody would, since the reaper
        takes over only dead owners' claims."""
        with self._serving_lock:
            alone = self._serving[rid] == 1
        if not alone:
            return Claim("busy", 0, claim.attempts)
        log.info("event=claim_adopted request_id=%s epoch=%d attempt=%d", rid, claim.epoch, claim.attempts)
        return Claim("claimed", claim.epoch, claim.attempts)

    def note_taken(self, rid: str) -> None:
        """The request's message left the queue for this worker (it may wait in the prefetch)."""
        try:
            self.claims.mark_taken(rid, self.instance)
        except redis.RedisError as exc:  # the message is ours all the same; the reaper may resend it later
            log.warning("event=mark_taken_failed request_id=%s error=%r", rid, exc)

    def _claim(self, rid: str) -> Claim | None:
        """None: cancelled while queued, and never to be claimed."""
        if self.redis.exists(redis_keys.cancelled(rid)):
            log.info("event=skipped_cancelled request_id=%s", rid)
            self.redis.zrem(redis_keys.UNCLAIMED, rid)
            self.redis.hdel(redis_keys.TAKEN, rid)
            return None
        if self.heartbeat.renew_if_lapsed():
            log.info("event=heartbeat_renewed_before_claim request_id=%s", rid)
        return self.claims.claim(rid, self.instance)

    def _end_without_engine(self, entry: InFlight, prompt_tokens: int) -> None:
        """An n > 1 request whose every choice had ended in the log when its worker died: publish
        its `done` from what the log says, as the engine would have: the request ends as its last
        choice did (choice_ends is in the log's order), and its usage counts the prompt."""
        self.held.forget(entry.queued.request_id)
        reason = list(entry.choice_ends.values())[-1] if entry.choice_ends else "stop"
        update = SequenceUpdate(entry.queued.request_id, None, None, "", finish_reason=reason,
                                prompt_tokens=prompt_tokens, timing={})
        self.replies.publish([(entry.queued.reply_channel, done_reply(entry, update, self.worker_name))], [entry])
        entry.finish_reason = reason

    def _refuse(self, entry: InFlight, code: str, message: str) -> None:
        rid = entry.queued.request_id
        event = ReplyEvent(type="error", request_id=rid, epoch=entry.epoch, code=code, message=message)
        self.replies.publish([(entry.queued.reply_channel, event)], [])
        self.metrics.failed(code)
        log.info("event=refused request_id=%s code=%s", rid, code)

    def _retrying(self, call):
        """Redis calls a task cannot do without: wait out an outage instead of failing the request
        (until the worker stops)."""
        return redis_clients.outage_retry().call_with_retry(call, self._redis_down, with_failure_count=True)

    def _redis_down(self, exc: redis.RedisError, failures: int) -> None:
        if self.stop.is_set():
            raise exc
        log.warning("event=redis_retry error=%r delay_s=%.2f", exc, redis_clients.outage_pause_s(failures))
