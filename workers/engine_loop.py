"""The engine thread (`brigade-engine`): `Engine.run`, with what a worker does after each step.

Each step's updates about the requests this worker holds become their reply events
(inflight.py), the step's facts go into the metrics and the request log (`record_step`), and the
events go out in one publish on the publishing thread (publisher.py, StepPump) while the engine
computes its next step. When the engine starts computing a request, our
death from then on counts as one of its attempts (claims.py, engage).
"""
from __future__ import annotations

import logging
import threading
import time
from collections import Counter

import redis

from engine import Engine, SequenceUpdate
from ops.core.messages import ReplyEvent
from workers.claims import ClaimStore
from workers.held import HeldRequests
from workers.inflight import InFlight, done_reply, token_reply
from workers.metrics import WorkerMetrics
from workers.prefix_report import PrefixReport
from workers.publisher import ReplyPublisher, StepPump

log = logging.getLogger("brigade.worker")

# One request's share of a step: its InFlight, its update, and its done event if the update ended it.
StepShare = tuple[InFlight, SequenceUpdate, ReplyEvent | None]


class EngineLoop:
    def __init__(self, engine: Engine, worker_name: str, held: HeldRequests, replies: ReplyPublisher,
                 claims: ClaimStore, metrics: WorkerMetrics, stop: threading.Event, prefixes: PrefixReport):
        self.engine = engine
        self.worker_name = worker_name
        self.held = held
        self.replies = replies
        self.claims = claims
        self.metrics = metrics
        self.prefixes = prefixes
        # The engine may have been loaded long before this loop starts: its progress counts from now.
        engine.loop_at = time.monotonic()
        engine.on_step = metrics.on_step
        engine.on_started = self._engaged
        # Prefix changes outside a step's updates (an eviction at admission) go out on the loop's turn.
        self.thread = threading.Thread(target=engine.run, args=(self._on_updates, stop, prefixes.publish),
                                       name="brigade-engine", daemon=True)
        self.pump = StepPump(replies, stop)

    @property
    def threads(self) -> list[threading.Thread]:
        """The engine's thread, then the publishing one (which ends after it, once what it holds is out)."""
        return [self.thread, self.pump.thread]

    def alive(self) -> bool:
        return self.thread.is_alive() and self.pump.thread.is_alive()

    def _on_updates(self, updates: list[SequenceUpdate]) -> None:
        events, ended, step = [], [], []
        for entry, u in self.held.match(updates):
            channel = entry.queued.reply_channel
            done = None
            if u.index is not None:
                events.append((channel, token_reply(entry, u)))
            if u.finish_reason is not None:
                done = done_reply(entry, u, self.worker_name)
                events.append((channel, done))
                entry.finish_reason = u.finish_reason
                ended.append(entry)
            step.append((entry, u, done))
        record_step(self.metrics, step)
        # The blocks this step stored first (here, on the engine thread, before the events are handed
        # on): a client that reads its `done` and sends the next turn must find them routed here
        # (workers/prefix_report.py).
        self.prefixes.publish()
        if events or ended:
            self.pump.put(events, ended)

    def _engaged(self, started: set[str]) -> None:
        """The engine starts computing these requests: our death counts as an attempt for each
        from now on (workers/claims.py, engage)."""
        epochs = self.held.epochs(started)
        try:
            self.claims.engage(epochs)
        except redis.RedisError as exc:  # a death now would cost them no attempt: nothing worse
            log.warning("event=engage_failed requests=%d error=%r", len(epochs), exc)


def record_step(m: WorkerMetrics, step: list[StepShare]) -> None:
    """One engine step's facts into the metrics and the request log (engine thread): counters are
    added once per step, not once per token."""
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
        if done is not None and u.index is None and entry.queued.params.max_tokens == 0:
            m.prompt_tokens.inc(u.prompt_tokens)  # a prompt only scored: prefilled, and no token follows
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
