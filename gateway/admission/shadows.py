"""Shadow copies: a served request run again on another version, measured, never delivered.

A route may give some versions a shadow copy of its requests (`brigade route`, ops/rollout/registry.py).
A copy runs in the batch lane (behind all interactive work, preempted for it), under its own id
and no key: it is never delivered, never cached, never charged. Its latency, its error and whether
its text equals the served answer go into its version's outcomes and the shadow counter; whichever
of the two ends first waits for the other in a `ShadowPair`.
"""
from __future__ import annotations

import dataclasses
import logging
import time
import uuid
from dataclasses import dataclass, field
from typing import Callable

from gateway import metrics
from gateway.admission.catalog import Choice
from gateway.admission.request_store import RequestStore
from gateway.delivery.events import ClientEvent
from gateway.delivery.router import ReplyRouter, Route, Sink
from ops.core import redis_keys
from ops.rollout import outcomes
from ops.core.messages import QueuedRequest, ReplyEvent
from ops.core.settings import Settings

log = logging.getLogger("brigade.gateway")


@dataclass
class ShadowContext:
    """A shadow copy's route: measured when it ends, compared with the served answer, never delivered."""

    primary: str  # the served request's id
    choice: Choice


class ShadowSink(Sink):
    """Where a shadow's events go: nowhere. Its answer is only measured."""

    def send(self, event: ClientEvent) -> None:
        pass


@dataclass
class ShadowPair:
    """A served answer and its shadows' outcomes, until both sides have ended."""

    shadows: int = 0  # shadow copies not yet measured
    served_text: str | None = None
    served_ended: bool = False
    waiting: list = field(default_factory=list)  # (shadow choice, its outcome, its text) before the served one ended
    at: float = field(default_factory=time.time)


class Shadows:
    def __init__(self, settings: Settings, router: ReplyRouter, store: RequestStore, spawn: Callable):
        self.settings = settings
        self.router = router
        self.store = store
        self._spawn = spawn
        self.pairs: dict[str, ShadowPair] = {}  # served request id -> its shadows' comparison

    def expect(self, rid: str, count: int) -> None:
        """Before the shadows are sent: a served answer that ends first must find its pair."""
        self.pairs[rid] = ShadowPair(shadows=count)

    async def start(self, served: QueuedRequest, choice: Choice) -> None:
        rid = uuid.uuid4().hex
        queued = served.model_copy(update={"request_id": rid, "client_id": rid, "version": choice.version,
                                           "enqueued_at": time.time(), "lane": "batch", "api_key": None,
                                           "deadline_at": None, "shadow_of": served.request_id})
        self.router.add(Route(rid, rid, ShadowSink(), keep_text=True, context=ShadowContext(served.request_id, choice),
                              model=choice.model, version=choice.version))
        try:
            await self.store.put(queued)
        except Exception as exc:
            self.router.remove(rid)
            log.warning("event=shadow_not_queued request_id=%s version=%s error=%r", served.request_id,
                        choice.version, exc)
            metrics.SHADOW_REQUESTS.labels(choice.model, choice.version, "not_queued").inc()
            self._one_less(served.request_id)
            return
        log.info("event=shadow_queued request_id=%s shadow=%s version=%s", served.request_id, rid, choice.version)

    def ended(self, route: Route, reply: ReplyEvent | None) -> None:
        """A shadow's route ended (`reply` None: stopped without an answer, nothing to measure)."""
        context: ShadowContext = route.context
        if reply is None:
            self._one_less(context.primary)
            return
        error = reply.type != "done"
        outcome = outcomes.from_timing(reply.timing, reply.usage, error=error, shadow=True)
        pair = self.pairs.get(context.primary)
        if pair is not None and not pair.served_ended:
            pair.waiting.append((context.choice, outcome, None if error else route.text))
            return
        self._measured(context.choice, outcome, None if error else route.text,
                       pair.served_text if pair is not None else None)
        self._one_less(context.primary)

    def served_ended(self, rid: str, text: str | None) -> None:
        """The served answer ended (text None: it failed or stopped): its shadows can be compared."""
        pair = self.pairs.get(rid)
        if pair is None:
            return
        pair.served_ended, pair.served_text = True, text
        waiting, pair.waiting = pair.waiting, []
        for choice, outcome, shadow_text in waiting:
            self._measured(choice, outcome, shadow_text, text)
        self._one_less(rid, len(waiting))
        self._forget_old_pairs()

    def _one_less(self, rid: str, measured: int = 1) -> None:
        """`measured` more of a pair's shadows are done with: the pair goes once all are and its
        served answer ended."""
        pair = self.pairs.get(rid)
        if pair is None:
            return
        pair.shadows -= measured
        if pair.shadows <= 0 and pair.served_ended:
            del self.pairs[rid]

    def _measured(self, choice: Choice, outcome: outcomes.Outcome, shadow_text: str | None,
                  served_text: str | None) -> None:
        same = None if shadow_text is None or served_text is None else shadow_text == served_text
        outcome = dataclasses.replace(outcome, same_text=same)
        result = "error" if outcome.error else "unknown" if same is None else "same" if same else "different"
        metrics.SHADOW_REQUESTS.labels(choice.model, choice.version, result).inc()
        log.info("event=shadow_measured model=%s version=%s result=%s e2e_s=%s", choice.model, choice.version,
                 result, outcome.e2e_s)
        self._spawn(self.store.record(choice, outcome))

    def _forget_old_pairs(self) -> None:
        """A pair whose shadows never ended (their worker died for good) goes after the replay log's life."""
        horizon = time.time() - redis_keys.stream_ttl_s(self.settings)
        for rid in [rid for rid, pair in self.pairs.items() if pair.at < horizon]:
            del self.pairs[rid]
