"""One engine per worker process, stepping on its own thread; Celery task threads hand it work.

A task thread calls `serve()`, which queues the request in the engine and blocks until the
request ends, so the Celery pool's concurrency bounds how many requests one worker holds.
Beside the engine thread run two small ones: the cancel listener (stops requests a gateway
cancelled) and the status beat (the worker's heartbeat key, read by /readyz and operators).
"""
from __future__ import annotations

import json
import logging
import os
import threading
import time
from dataclasses import dataclass, field

import redis

from engine import Engine, EngineConfig, EngineRequest, RequestRejected, SamplingParams, SequenceUpdate
from engine.model_files import prepare_default_model
from ops import keys
from ops.messages import QueuedRequest, ReplyEvent
from ops.settings import Settings, torch_threads
from workers.publisher import TokenPublisher

log = logging.getLogger("brigade.worker")


@dataclass
class InFlight:
    queued: QueuedRequest
    added_at: float  # unix seconds when the engine received it
    finished: threading.Event = field(default_factory=threading.Event)
    finish_reason: str | None = None


def engine_config(settings: Settings) -> EngineConfig:
    model_dir = settings.model_dir
    if not settings.model:
        prepare_default_model(model_dir)
    return EngineConfig(
        model=str(model_dir),
        max_batch=settings.max_batch,
        max_wait_ms=settings.max_wait_ms,
        kv_budget_tokens=settings.kv_budget_tokens,
        kv_budget_bytes=settings.kv_budget_bytes,
        max_prefill_tokens=settings.max_prefill_tokens,
        torch_threads=torch_threads(settings),
    )


def sampling_params(queued: QueuedRequest) -> SamplingParams:
    p = queued.params
    return SamplingParams(
        max_tokens=p.max_tokens,
        temperature=p.temperature,
        top_p=p.top_p,
        top_k=p.top_k,
        repetition_penalty=p.repetition_penalty,
        stop=tuple(p.stop),
        seed=p.seed,
    )


class EngineHost:
    def __init__(self, settings: Settings, worker_name: str, engine: Engine):
        self.settings = settings
        self.worker_name = worker_name
        self.engine = engine
        # A stuck Redis must not freeze the engine thread inside a publish.
        self.redis = redis.Redis.from_url(settings.redis_url, socket_timeout=5, socket_connect_timeout=2)
        self.publisher = TokenPublisher(self.redis, settings)
        self.inflight: dict[str, InFlight] = {}
        self.requests_served = 0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._threads = [
            threading.Thread(target=engine.run, args=(self._on_updates, self._stop), name="engine", daemon=True),
            threading.Thread(target=self._listen_for_cancels, name="cancels", daemon=True),
            threading.Thread(target=self._beat, name="status", daemon=True),
        ]

    @classmethod
    def start(cls, settings: Settings, worker_name: str) -> "EngineHost":
        host = cls(settings, worker_name, Engine.load(engine_config(settings)))
        for t in host._threads:
            t.start()
        log.info("event=worker_ready worker=%s model=%s", worker_name, host.engine.config.model)
        return host

    def close(self) -> None:
        self._stop.set()
        self.engine.wake()
        for t in self._threads:
            t.join(timeout=5)
        self.redis.delete(keys.worker(self.worker_name))

    # ---- called on Celery task threads -------------------------------------------------------------

    def serve(self, queued: QueuedRequest) -> str:
        """Run one request to its end; returns its finish reason (or the refusal code)."""
        rid = queued.request_id
        if self.redis.exists(keys.cancelled(rid)):
            log.info("event=skipped_cancelled request_id=%s", rid)
            return "cancelled"
        entry = InFlight(queued, added_at=time.time())
        with self._lock:
            self.inflight[rid] = entry
        try:
            self.engine.add_request(
                EngineRequest(
                    rid,
                    sampling_params(queued),
                    prompt=queued.prompt,
                    messages=[m.model_dump() for m in queued.messages] if queued.messages is not None else None,
                )
            )
        except RequestRejected as refused:
            with self._lock:
                self.inflight.pop(rid, None)
            event = ReplyEvent(type="error", request_id=rid, code=refused.code, message=refused.message)
            self.publisher.publish([(queued.reply_channel, event)])
            log.info("event=refused request_id=%s code=%s", rid, refused.code)
            return refused.code
        # A cancel may have landed between the check above and the registration.
        if self.redis.exists(keys.cancelled(rid)):
            self.engine.cancel(rid)
        entry.finished.wait()
        return entry.finish_reason or "error"

    # ---- the engine thread's callback ------------------------------------------------------------

    def _on_updates(self, updates: list[SequenceUpdate]) -> None:
        events, ended = [], []
        with self._lock:
            for u in updates:
                entry = self.inflight.get(u.request_id)
                if entry is None:
                    continue
                channel = entry.queued.reply_channel
                if u.index is not None:
                    events.append((channel, ReplyEvent(type="token", request_id=u.request_id, index=u.index, text=u.text)))
                if u.finish_reason is not None:
                    events.append((channel, self._done_event(entry, u)))
                    ended.append((entry, u.finish_reason))
                    del self.inflight[u.request_id]
        try:
            self.publisher.publish(events)
        except redis.RedisError:
            log.exception("event=publish_failed events=%d", len(events))
        finally:
            for entry, reason in ended:
                entry.finish_reason = reason
                self.requests_served += 1
                entry.finished.set()

    def _done_event(self, entry: InFlight, u: SequenceUpdate) -> ReplyEvent:
        t = u.timing or {}
        broker_wait = max(0.0, entry.added_at - entry.queued.enqueued_at)

        def plus_wait(v):
            return None if v is None else round(v + broker_wait, 6)

        timing = {
            "queue_s": plus_wait(t.get("queue_s")),
            "prefill_s": t.get("prefill_s"),
            "ttft_s": plus_wait(t.get("ttft_s")),
            "tpot_s": t.get("tpot_s"),
            "e2e_s": round(time.time() - entry.queued.enqueued_at, 6),
            "worker": self.worker_name,
        }
        usage = {"prompt_tokens": u.prompt_tokens, "completion_tokens": u.completion_tokens}
        return ReplyEvent(
            type="done", request_id=u.request_id, finish_reason=u.finish_reason, usage=usage, timing=timing
        )

    # ---- side threads ------------------------------------------------------------------------------

    def _listen_for_cancels(self) -> None:
        while not self._stop.is_set():
            try:
                pubsub = self.redis.pubsub(ignore_subscribe_messages=True)
                pubsub.subscribe(keys.CANCEL_CHANNEL)
                while not self._stop.is_set():
                    message = pubsub.get_message(timeout=0.5)
                    if message and message["type"] == "message":
                        rid = message["data"].decode()
                        with self._lock:
                            mine = rid in self.inflight
                        if mine:
                            log.info("event=cancel request_id=%s", rid)
                            self.engine.cancel(rid)
            except redis.RedisError as exc:
                log.warning("event=cancel_listener_error error=%r", exc)
                self._stop.wait(1.0)

    def status(self, tokens_per_s: float) -> dict:
        stats = self.engine.stats()
        with self._lock:
            requests = sorted(self.inflight)
        return {
            "worker": self.worker_name,
            "pid": os.getpid(),
            "model": self.settings.model_name,
            **stats,
            "tokens_per_s": round(tokens_per_s, 2),
            "requests": requests,
            "requests_served": self.requests_served,
            "updated_at": time.time(),
        }

    def _beat(self) -> None:
        last_tokens, last_time = self.engine.tokens_generated, time.monotonic()
        interval = self.settings.worker_status_interval_s
        ttl_ms = int(self.settings.worker_status_ttl_s * 1000)
        while not self._stop.is_set():
            now, tokens = time.monotonic(), self.engine.tokens_generated
            rate = (tokens - last_tokens) / max(now - last_time, 1e-6)
            last_tokens, last_time = tokens, now
            try:
                self.redis.set(keys.worker(self.worker_name), json.dumps(self.status(rate)), px=ttl_ms)
            except redis.RedisError as exc:
                log.warning("event=status_beat_failed error=%r", exc)
            self._stop.wait(interval)
