"""Audits: a share of semantic hits asked again of the model, to measure what the cache serves.

A semantic hit is answered at once from the cache. With probability `cache_audit_share` the same
request is also queued in the batch lane (behind all interactive work, preempted for it) under
its own id and no key: never delivered, never cached, never charged. When it ends its answer is
compared with the one served (cache/evidence.py): evidence that moves the thresholds, and the
random sample behind the error rate `brigade cache stats` estimates.
"""
from __future__ import annotations

import asyncio
import logging
import random
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable

from cache.evidence import answers_agree, observed
from gateway import metrics
from gateway.admission.catalog import Choice
from gateway.admission.request_store import RequestStore
from gateway.delivery.events import ClientEvent
from gateway.delivery.router import ReplyRouter, Route, Sink
from ops.core.messages import QueuedRequest, ReplyEvent
from ops.core.settings import Settings

if TYPE_CHECKING:  # not at run time: the cache brings the embedding model (and torch) with it
    from cache.answer_cache import AnswerCache, Hit

log = logging.getLogger("brigade.gateway")


@dataclass
class AuditContext:
    """An audit's route: what was served, to compare the model's answer with when it ends."""

    entry_id: str
    cosine: float
    score: float | None
    served: str
    choice: Choice


class AuditSink(Sink):
    """Where an audit's events go: nowhere. Its answer is only compared."""

    def send(self, event: ClientEvent) -> None:
        pass


class Audits:
    def __init__(self, settings: Settings, router: ReplyRouter, store: RequestStore, spawn: Callable):
        self.share = settings.cache_audit_share
        self.router = router
        self.store = store
        self._spawn = spawn
        self.cache: AnswerCache | None = None
        self.rng = random.Random()

    def use_cache(self, cache: AnswerCache) -> None:
        self.cache = cache

    def due(self, hit: Hit) -> bool:
        return hit.layer == "semantic" and self.cache is not None and self.rng.random() < self.share

    async def start(self, served: QueuedRequest, hit: Hit, choice: Choice) -> None:
        """`served`: the request as it would have been queued (its id is the audit's own)."""
        rid = served.request_id
        context = AuditContext(hit.entry.entry_id, hit.similarity, hit.score, hit.entry.answer, choice)
        self.router.add(Route(rid, rid, AuditSink(), keep_text=True, context=context, model=choice.model,
                              version=choice.version))
        try:
            await self.store.put(served)
        except Exception as exc:
            self.router.remove(rid)
            log.warning("event=cache_audit_not_queued entry=%s error=%r", hit.entry.entry_id, exc)
            metrics.CACHE_AUDITS.labels(choice.model, "not_queued").inc()
            return
        log.info("event=cache_audit_queued entry=%s audit=%s cosine=%.4f", hit.entry.entry_id, rid, hit.similarity)

    def ended(self, route: Route, reply: ReplyEvent | None) -> None:
        context: AuditContext = route.context
        if reply is None or reply.type != "done":
            metrics.CACHE_AUDITS.labels(context.choice.model, "error").inc()
            return
        self._spawn(self._compare(context, route.text))

    async def _compare(self, context: AuditContext, answer: str) -> None:
        agreed = await asyncio.to_thread(answers_agree, context.served, answer, self.cache.embedder,
                                         self.cache.settings.cache_answer_agreement)
        await self.cache.observe(observed("audit", entry=context.entry_id, cosine=context.cosine,
                                          score=context.score, agreed=agreed))
        metrics.CACHE_AUDITS.labels(context.choice.model, "agreed" if agreed else "different").inc()
        log.info("event=cache_audit_measured entry=%s cosine=%.4f agreed=%s", context.entry_id, context.cosine,
                 agreed)
