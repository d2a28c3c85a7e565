"""One engine per worker process, stepping on its own thread; Celery task threads hand it work.

A task thread calls `serve()`, which claims the request (claims.py), continues it from its replay
log when an earlier worker already sent tokens, and blocks until it ends, so the Celery pool's
concurrency bounds how many requests one worker holds. Beside the engine thread run two small
ones: the cancel listener (stops requests a gateway cancelled) and the heartbeat (the worker's
status key, whose expiry tells the reaper to hand its requests to another worker). The worker's
Prometheus metrics (metrics.py) are recorded here, where each fact becomes known, and served on
their own port, whose address the heartbeat publishes.

Loading the engine is engine_loading.py's; what a request becomes on its way in and out (InFlight,
its EngineRequest, its reply events) is inflight.py's.
"""
from __future__ import annotations

import logging
import os
import threading
import time
import uuid
from collections import Counter

import redis

from engine import Engine, RequestRejected, SequenceUpdate
from ops.core import fleet, keys, redis_clients
from ops.core.messages import QueuedRequest, ReplyEvent
from ops.core.sampling_defaults import load_sampling_defaults
from ops.core.settings import Settings
from ops.core.queue import enqueue
from workers.claims import ClaimStore
from workers.engine_loading import load_engine
from workers.inflight import InFlight, done_reply, engine_request, token_reply
from workers.metrics import MetricsEndpoint, WorkerMetrics, serve_metrics
from workers.publisher import TokenPublisher

log = logging.getLogger("brigade.worker")


class EngineHost:
    def __init__(self, settings: Settings, worker_name: str, engine: Engine):
        self.settings = settings
        self.worker_name = worker_name
        # Unique per process start: a restarted worker with the same name is a new owner.
        self.instance = f"{worker_name}#{uuid.uuid4().hex[:8]}"
        self.engine = engine
        self.sampling_defaults = load_sampling_defaults(settings)
        # The engine may have been loaded long before this host starts its thread: count from now.
        engine.loop_at = time.monotonic()
        # A stuck Redis must not freeze the engine thread inside a publish (the client's timeout).
        self.redis = redis_clients.client(settings.redis_url)
        self.claims = ClaimStore.from_settings(self.redis, settings)
        self.publisher = TokenPublisher(self.claims)
        self.inflight: dict[str, InFlight] = {}
        self.requests_served = 0
        self.metrics = WorkerMetrics(settings.model_name, settings.model_version)
        self.metrics.watch_engine(engine.stats)
        engine.on_step = self.metrics.on_step
        engine.on_started = self._engaged
        self.metrics_endpoint: MetricsEndpoint | None = None
        self.draining = threading.Event()
        self._lock = threading.Lock()
        self._publish_lock = threading.Lock()
        self._unsettled: list[InFlight] = []  # ended, but their last event is not in Redis yet
        # The engine made no progress for engine_stall_s: the heartbeat stops vouching for us.
        self._stalled = False
        self._stop = threading.Event()
        self._threads = [
            threading.Thread(target=engine.run, args=(self._on_updates, self._stop), name="engine", daemon=True),
            threading.Thread(target=self._listen_for_cancels, name="cancels", daemon=True),
            threading.Thread(target=self._beat, name="heartbeat", daemon=True),
        ]

    @classmethod
    def start(cls, settings: Settings, worker_name: str, engine: Engine | None = None) -> "EngineHost":
        host = cls(settings, worker_name, engine or load_engine(settings))
        # Before the first heartbeat, which publishes the address.
        host.metrics_endpoint = serve_metrics(settings.worker_metrics_host, settings.worker_metrics_port,
                                              settings.worker_metrics_advertise_host)
        for t in host._threads:
            t.start()
        log.info("event=worker_ready worker=%s instance=%s served=%s model=%s", worker_name, host.instance,
                 keys.served(settings.model_name, settings.model_version), host.engine.config.model)
        return host

    def close(self) -> None:
        self._stop.set()
        self.engine.wake()
        for t in self._threads:
            t.join(timeout=5)
        try:
            fleet.forget(self.redis, self.instance)
        except redis.RedisError:
            pass
        if self.metrics_endpoint is not None:
            self.metrics_endpoint.close()
        self.metrics.unwatch_engine()

    # ---- called on Celery task threads -------------------------------------------------------------

    def serve(self, queued: QueuedRequest) -> str:
        """Run one request to its end; returns how it ended (finish reason, refusal code or skip)."""
        rid = queued.request_id
        if self.draining.is_set():
            enqueue(queued)  # taken from the queue while draining: back it goes, untouched
            return "handed_back"
        claim = self._retrying(lambda: self._claim(rid))
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
        if rid in self.inflight:
            self._drop_fenced(rid)
        while self.engine.holds(rid) and not self._stop.is_set():
            time.sleep(0.01)
        logged = self._retrying(lambda: self.claims.logged_tokens(rid))
        # Epochs follow the clock (claim.lua), so a first run is told by its attempts and its log.
        entry.continued = claim.attempts > 1 or bool(logged)
        # The deadline is for work not yet started; a continued request is finished.
        if not entry.continued and queued.deadline_at is not None and time.time() > queued.deadline_at:
            self._refuse(entry, "deadline_exceeded", "the request's deadline passed while it waited in the queue")
            return "deadline_exceeded"
        with self._lock:
            draining = self.draining.is_set()
            if not draining:
                self.inflight[rid] = entry
        if draining:  # the drain began while we claimed: hand it straight back
            self._hand_back(entry)
            return "handed_back"
        try:
            request = engine_request(entry, self.sampling_defaults, logged)
            if request.choices == []:  # every choice ended before the hand-over: only the end is missing
                self._end_without_engine(entry, len(self.engine.encode(request)))
                return entry.finish_reason or "stop"
            self.engine.add_request(request)
        except RequestRejected as refused:
            with self._lock:
                self.inflight.pop(rid, None)
            self._refuse(entry, refused.code, refused.message)
            return refused.code
        except Exception:  # e.g. the tokenizer failing on this input: the client must hear of it
            log.exception("event=request_failed request_id=%s", rid)
            with self._lock:
                self.inflight.pop(rid, None)
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
        if self.redis.exists(keys.cancelled(rid)):
            self.engine.cancel(rid)
        entry.finished.wait()
        return entry.finish_reason or "error"

    def _end_without_engine(self, entry: InFlight, prompt_tokens: int) -> None:
        """An n > 1 request whose every choice had ended in the log when its worker died: publish
        its `done` from what the log says, as the engine would have: the request ends as its last
        choice did (choice_ends is in the log's order), and its usage counts the prompt."""
        rid = entry.queued.request_id
        with self._lock:
            self.inflight.pop(rid, None)
        reason = list(entry.choice_ends.values())[-1] if entry.choice_ends else "stop"
        update = SequenceUpdate(rid, None, None, "", finish_reason=reason, prompt_tokens=prompt_tokens, timing={})
        self._publish([(entry.queued.reply_channel, done_reply(entry, update, self.worker_name))], [entry])
        entry.finish_reason = reason

    def note_taken(self, rid: str) -> None:
        try:
            self.claims.mark_taken(rid, self.instance)
        except redis.RedisError as exc:  # the message is ours all the same; the reaper may resend it later
            log.warning("event=mark_taken_failed request_id=%s error=%r", rid, exc)

    def _claim(self, rid: str):
        if self.redis.exists(keys.cancelled(rid)):
            log.info("event=skipped_cancelled request_id=%s", rid)
            self.redis.zrem(keys.UNCLAIMED, rid)
            return None
        vouching = not self._stalled and self._threads[0].is_alive()  # as the heartbeat thread would
        if vouching and not self.redis.exists(keys.worker(self.instance)):
            # Back from a cut from Redis, our heartbeat had expired and the heartbeat thread beats
            # again only on its next turn: a claim made before then was reaped at once (no
            # heartbeat), and our run of it fenced. Beat first, so that the claim is vouched for.
            self._record_beat(0.0)
            log.info("event=heartbeat_renewed_before_claim request_id=%s", rid)
        return self.claims.claim(rid, self.instance)

    def _engaged(self, started: set[str]) -> None:
        """The engine starts computing these requests (engine thread): our death counts as an
        attempt for each from now on (workers/claims.py, engage)."""
        with self._lock:
            epochs = {rid: self.inflight[rid].epoch for rid in started if rid in self.inflight}
        try:
            self.claims.engage(epochs)
        except redis.RedisError as exc:  # a death now would cost them no attempt: nothing worse
            log.warning("event=engage_failed requests=%d error=%r", len(epochs), exc)

    def _retrying(self, call):
        """Redis calls a task cannot do without: wait out an outage instead of failing the request
        (until the host stops)."""
        return redis_clients.outage_retry().call_with_retry(call, self._redis_down, with_failure_count=True)

    def _redis_down(self, exc: redis.RedisError, failures: int) -> None:
        if self._stop.is_set():
            raise exc
        log.warning("event=redis_retry error=%r delay_s=%.2f", exc, redis_clients.outage_pause_s(failures))

    def _refuse(self, entry: InFlight, code: str, message: str) -> None:
        rid = entry.queued.request_id
        event = ReplyEvent(type="error", request_id=rid, epoch=entry.epoch, code=code, message=message)
        self._publish([(entry.queued.reply_channel, event)], [])
        self.metrics.failed(code)
        log.info("event=refused request_id=%s code=%s", rid, code)

    # ---- graceful drain (SIGTERM) ----------------------------------------------------------------------

    def drain(self, seconds: float) -> None:
        """Take no more work, let running requests finish for `seconds`, then hand the rest back with
        their progress (the next worker continues from the replay log) and release their tasks."""
        with self._lock:  # serve() registers under this lock after checking the flag
            self.draining.set()
        log.info("event=draining running=%d seconds=%.1f", len(self.inflight), seconds)
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            with self._lock:
                if not self.inflight:
                    break
            time.sleep(0.05)
        with self._lock:
            rest = list(self.inflight.values())
            self.inflight.clear()
        for entry in rest:
            self.engine.cancel(entry.queued.request_id)
            self._hand_back(entry)
            entry.finish_reason = "handed_back"
            entry.finished.set()
        log.info("event=drained handed_back=%d", len(rest))

    def _hand_back(self, entry: InFlight) -> None:
        """Release our claim (fencing ourselves) and queue the request again with its progress."""
        rid = entry.queued.request_id
        self.publisher.forget(rid)
        try:
            if self.claims.release(rid, self.instance, entry.epoch):
                enqueue(entry.queued)
                log.info("event=handed_back request_id=%s", rid)
        except Exception as exc:  # Redis down: the reaper hands it over once the heartbeat stops
            log.warning("event=hand_back_failed request_id=%s error=%r", rid, exc)

    # ---- the engine thread's callback ------------------------------------------------------------

    def _on_updates(self, updates: list[SequenceUpdate]) -> None:
        events, ended, mine = [], [], []
        with self._lock:
            for u in updates:
                entry = self.inflight.get(u.request_id)
                if entry is None:
                    continue  # cancelled, fenced or handed back
                channel = entry.queued.reply_channel
                done = None
                if u.index is not None:
                    events.append((channel, token_reply(entry, u)))
                if u.finish_reason is not None:
                    done = done_reply(entry, u, self.worker_name)
                    events.append((channel, done))
                    entry.finish_reason = u.finish_reason
                    ended.append(entry)
                    del self.inflight[u.request_id]
                mine.append((entry, u, done))
        self._record(mine)
        self._publish(events, ended)

    def _record(self, step: list[tuple[InFlight, SequenceUpdate, ReplyEvent | None]]) -> None:
        """One engine step's facts into the metrics and the request log (engine thread, outside
        the host's lock): counters are added once per step, not once per token."""
        m = self.metrics
        now, wall = time.monotonic(), time.time()
        tokens: Counter[str] = Counter()  # by lane
        for entry, u, done in step:
            # Batch lines' latencies (minutes behind interactive work, by design) would drown the
            # interactive lane's in the histograms: they are counted by lane only.
            interactive = entry.queued.lane == "interactive"
            if u.index is not None:
                tokens[entry.queued.lane] += 1
                if entry.last_token_at is None:  # its first token here: this worker prefilled the prompt
                    m.prompt_tokens.inc(u.prompt_tokens)
                    if u.index == 0 and interactive:  # the request's first token at all
                        m.ttft.observe(max(0.0, wall - entry.queued.enqueued_at))
                elif interactive:
                    m.itl.observe(now - entry.last_token_at)
                entry.last_token_at = now
            if done is not None:
                m.lane_requests[entry.queued.lane].inc()
                # A continued request's broker wait would include its earlier run: count only its
                # wait on this engine.
                queue_s = (u.timing or {}).get("queue_s") if entry.continued else done.timing.get("queue_s")
                m.finished(u.finish_reason, done.timing, queue_s, latencies=interactive)
                usage, t = done.usage or {}, done.timing or {}
                log.info("event=request_done request_id=%s lane=%s finish_reason=%s prompt_tokens=%s "
                         "completion_tokens=%s queue_s=%s ttft_s=%s e2e_s=%s continued=%s", u.request_id,
                         entry.queued.lane, done.finish_reason, usage.get("prompt_tokens"),
                         usage.get("completion_tokens"), t.get("queue_s"), t.get("ttft_s"), t.get("e2e_s"),
                         entry.continued)
        for lane, n in tokens.items():
            m.lane_tokens[lane].inc(n)
        if tokens:
            m.generation_tokens.inc(sum(tokens.values()))

    def _publish(self, events: list, ended: list[InFlight]) -> None:
        """Publish (or retry what waits); a request's task returns only once its last event is out."""
        with self._publish_lock:
            self._unsettled.extend(ended)
            fenced = self.publisher.publish(events)
            if fenced is None:
                return  # Redis is away: the heartbeat thread retries
            for rid in fenced:
                self._drop_fenced(rid)
            for entry in self._unsettled:
                self.requests_served += 1
                entry.finished.set()
            self._unsettled = []

    def _drop_fenced(self, rid: str) -> None:
        """Our claim was taken over (we stalled, or Redis lost it): stop, publish nothing more."""
        with self._lock:
            entry = self.inflight.pop(rid, None)
        self.publisher.forget(rid)
        self.engine.cancel(rid)
        log.warning("event=fenced request_id=%s", rid)
        if entry is not None:
            self._requeue_if_orphaned(entry)
            entry.finish_reason = "fenced"
            entry.finished.set()

    def _requeue_if_orphaned(self, entry: InFlight) -> None:
        """Fenced, and nobody holds the request: a Sentinel failover lost a claim (ours, or the raise
        that fenced us). Queue it again, as the reaper would for a dead owner: the next claim has a
        higher epoch (claim.lua) and continues from the replay log."""
        rid = entry.queued.request_id
        try:
            if self.claims.orphaned(rid, self.instance):
                self.redis.zadd(keys.UNCLAIMED, {rid: time.time()})
                enqueue(entry.queued)
                log.warning("event=orphan_requeued request_id=%s", rid)
        except redis.RedisError as exc:  # the reaper's unclaimed sweep is the second line
            log.warning("event=orphan_requeue_failed request_id=%s error=%r", rid, exc)

    # ---- side threads ------------------------------------------------------------------------------

    def _listen_for_cancels(self) -> None:
        while not self._stop.is_set():
            try:
                # Each lost subscription starts a new run of retries (the pause from its first step).
                pubsub = redis_clients.outage_retry().call_with_retry(
                    self._subscribe_to_cancels, self._cancels_lost, with_failure_count=True)
            except redis.RedisError:
                return  # stopping
            try:
                while not self._stop.is_set():
                    message = pubsub.get_message(timeout=0.5)
                    if message and message["type"] == "message":
                        rid = message["data"]
                        with self._lock:
                            mine = rid in self.inflight
                        if mine:
                            log.info("event=cancel request_id=%s", rid)
                            self.engine.cancel(rid)
            except redis.RedisError as exc:
                log.warning("event=cancel_listener_error error=%r", exc)

    def _subscribe_to_cancels(self):
        pubsub = self.redis.pubsub(ignore_subscribe_messages=True)
        pubsub.subscribe(keys.CANCEL_CHANNEL)
        return pubsub

    def _cancels_lost(self, exc: redis.RedisError, failures: int) -> None:
        if self._stop.is_set():
            raise exc
        log.warning("event=cancel_listener_error error=%r delay_s=%.2f", exc, redis_clients.outage_pause_s(failures))

    def status(self, tokens_per_s: float) -> dict:
        stats = self.engine.stats()
        with self._lock:
            requests = sorted(self.inflight)
        return {
            "worker": self.worker_name,
            "instance": self.instance,
            "pid": os.getpid(),
            "model": self.settings.model_name,
            "version": self.settings.model_version,  # "" when unversioned
            **stats,
            "tokens_per_s": round(tokens_per_s, 2),
            "requests": requests,
            "requests_served": self.requests_served,
            "draining": self.draining.is_set(),
            "metrics_url": self.metrics_endpoint.url if self.metrics_endpoint is not None else None,
            "updated_at": time.time(),
        }

    def _record_beat(self, tokens_per_s: float, prune: bool = False) -> None:
        """Our status, with the TTL whose expiry tells the reaper we are gone."""
        pipe = self.redis.pipeline(transaction=False)
        fleet.record_beat(pipe, self.instance, self.status(tokens_per_s), keys.worker_ttl_ms(self.settings),
                          time.time(), prune=prune)
        pipe.execute()

    def _beat(self) -> None:
        last_tokens, last_time = self.engine.tokens_generated, time.monotonic()
        interval = self.settings.heartbeat_interval_s
        beats = 0
        while not self._stop.is_set():
            if not self._threads[0].is_alive():
                # No engine, no progress: stop beating so that the reaper hands our requests on.
                log.error("event=engine_thread_dead heartbeat=stopped")
                return
            now, tokens = time.monotonic(), self.engine.tokens_generated
            rate = (tokens - last_tokens) / max(now - last_time, 1e-6)
            last_tokens, last_time = tokens, now
            silent = now - self.engine.loop_at
            if silent > self.settings.engine_stall_s:
                # A live process whose engine makes no progress must not vouch for its requests:
                # the key expires, the reaper fences us and continues them elsewhere.
                if not self._stalled:
                    log.error("event=engine_stalled seconds=%.1f heartbeat=stopped requests=%d", silent,
                              len(self.inflight))
                self._stalled = True
                self._stop.wait(interval)
                continue
            if self._stalled:
                log.warning("event=engine_recovered heartbeat=resumed")
                self._stalled = False
            try:
                self._record_beat(rate, prune=beats % fleet.PRUNE_EVERY == 0)
                beats += 1
            except redis.RedisError as exc:
                log.warning("event=heartbeat_failed error=%r", exc)
            if self.publisher.waiting or self._unsettled:
                self._publish([], [])
            self._stop.wait(interval)
