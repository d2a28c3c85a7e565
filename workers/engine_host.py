"""One engine per worker process, and the parts around it, wired together: EngineHost.

Each part has one job and its own thread where it needs one:
- serving.py: a Celery task's request, from its claim to its end (Celery's task threads);
- engine_loop.py: the engine's thread (`brigade-engine`), a step's updates into reply events,
  metrics and the request log;
- held.py: the requests this worker holds, and the drain flag that closes them to new ones;
- publisher.py: every reply event out, a request settled once its last event is in Redis;
- cancels.py: the cancel listener (`brigade-cancels`);
- heartbeat.py: the status key that vouches for the engine's progress (`brigade-heartbeat`);
- handover.py and drain.py: requests that leave unfinished, and the graceful drain.
The worker's Prometheus metrics (metrics.py) are served on their own port, whose address the
heartbeat publishes. Loading the engine is engine_loading.py's.
"""
from __future__ import annotations

import gc
import logging
import os
import threading
import time
import uuid

import redis

from engine import Engine
from ops.core import redis_clients, redis_keys, roster
from ops.core.messages import QueuedRequest
from ops.core.queue import QueueSender
from ops.core.settings import Settings
from workers.cancels import CancelListener
from workers.claims import ClaimStore
from workers.drain import Drain
from workers.engine_loading import load_engine
from workers.engine_loop import EngineLoop
from workers.handover import Handover
from workers.heartbeat import Heartbeat
from workers.held import HeldRequests
from workers.metrics import MetricsEndpoint, WorkerMetrics, serve_metrics
from workers.prefix_report import PrefixReport
from workers.publisher import ReplyPublisher, TokenPublisher
from workers.serving import Serving
from workers.stealing import Stealing

log = logging.getLogger("brigade.worker")

# How long close() waits for each of the host's threads to end.
JOIN_TIMEOUT_S = 5


class EngineHost:
    def __init__(self, settings: Settings, worker_name: str, engine: Engine, instance: str | None = None):
        self.settings = settings
        self.worker_name = worker_name
        # Unique per process start: a restarted worker with the same name is a new owner.
        self.instance = instance or f"{worker_name}#{uuid.uuid4().hex[:8]}"
        self.engine = engine
        # A stuck Redis must not freeze the engine thread inside a publish (the client's timeout).
        self.redis = redis_clients.client(settings.redis_url)
        self.claims = ClaimStore.from_settings(self.redis, settings)
        self.metrics = WorkerMetrics(settings.model_name, settings.model_version)
        self.metrics.watch_engine(engine.stats)
        self.metrics_endpoint: MetricsEndpoint | None = None
        self._stop = threading.Event()  # every thread of the host, and a task waiting out Redis, ends on it
        self.held = HeldRequests()
        tokens = TokenPublisher(self.claims)
        self.handover = Handover(self.instance, self.redis, self.claims, QueueSender(settings), self.held, engine,
                                 tokens.forget)
        self.replies = ReplyPublisher(tokens, on_fenced=self.handover.fenced)
        self.prefixes = PrefixReport(self.redis, settings, self.instance, engine)
        self.engine_loop = EngineLoop(engine, worker_name, self.held, self.replies, self.claims, self.metrics,
                                      self._stop, self.prefixes)
        self.cancels = CancelListener(self.redis, self.held, engine.cancel, self._stop)
        self.heartbeat = Heartbeat(self.redis, settings, self.instance, engine, self.engine_loop.alive, self.status,
                                   self.held, self._stop, on_beat=self._on_beat)
        self.graceful_drain = Drain(self.held, engine, self.handover)
        self.stealing = Stealing(self.redis, settings, self.instance, self._free_slots, self.metrics.stolen.inc,
                                 self._stop)
        self.serving = Serving(self.instance, worker_name, engine, self.redis,
                               self.claims, self.held, self.replies, self.handover, self.heartbeat, self.metrics,
                               self._stop)

    def _free_slots(self) -> int:
        """Requests this worker could start at once: free task threads, while its engine has free
        rows and nothing waits in it (else a stolen request would only wait here instead)."""
        if self.held.draining:
            return 0
        stats = self.engine.stats()
        if stats["waiting"] or stats["running"] >= self.settings.max_batch:
            return 0
        return max(0, self.settings.task_threads - len(self.held))

    def _on_beat(self) -> None:
        """Rides on each heartbeat: events waiting for Redis, and the prefix snapshot's lifetime."""
        self.replies.retry()
        self.prefixes.renew()

    @classmethod
    def start(cls, settings: Settings, worker_name: str, engine: Engine | None = None,
              instance: str | None = None) -> "EngineHost":
        host = cls(settings, worker_name, engine or load_engine(settings), instance)
        # Before the first heartbeat, which publishes the address.
        host.metrics_endpoint = serve_metrics(settings.worker_metrics_host, settings.worker_metrics_port,
                                              settings.worker_metrics_advertise_host)
        # The model, its tokenizer and every module loaded so far live as long as the worker: out of
        # the collector's sight, a full collection walks only what serving allocates (a worker's
        # profile at one stream showed the collector at about 2% of its samples).
        gc.freeze()
        host.start_threads()
        log.info("event=worker_ready worker=%s instance=%s served=%s model=%s", worker_name, host.instance,
                 redis_keys.served(settings.model_name, settings.model_version), host.engine.config.model)
        return host

    @property
    def threads(self) -> list[threading.Thread]:
        return [*self.engine_loop.threads, self.cancels.thread, self.heartbeat.thread, self.stealing.thread]

    def start_threads(self) -> None:
        for t in self.threads:
            t.start()

    def close(self) -> None:
        self._stop.set()
        self.engine.wake()
        for t in self.threads:
            t.join(timeout=JOIN_TIMEOUT_S)
        try:
            roster.forget(self.redis, self.instance)
        except redis.RedisError:
            pass
        if self.metrics_endpoint is not None:
            self.metrics_endpoint.close()
        self.metrics.unwatch_engine()

    # ---- called on Celery's threads ----------------------------------------------------------------

    def serve(self, queued: QueuedRequest) -> str:
        """Run one request to its end (a task thread); returns how it ended."""
        return self.serving.serve(queued)

    def note_taken(self, rid: str) -> None:
        self.serving.note_taken(rid)

    def drain(self, seconds: float) -> None:
        """Take no more work, let running requests finish for `seconds`, then hand the rest back."""
        self.graceful_drain.run(seconds)

    # ---- what the heartbeat says ---------------------------------------------------------------------

    def status(self, tokens_per_s: float) -> dict:
        stats = self.engine.stats()
        return {
            "worker": self.worker_name,
            "instance": self.instance,
            "pid": os.getpid(),
            "model": self.settings.model_name,
            "version": self.settings.model_version,  # "" when unversioned
            **stats,
            "tokens_per_s": round(tokens_per_s, 2),
            "requests": self.held.ids(),
            "requests_served": self.replies.requests_served,
            "draining": self.held.draining,
            "metrics_url": self.metrics_endpoint.url if self.metrics_endpoint is not None else None,
            "updated_at": time.time(),
        }
