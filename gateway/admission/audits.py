"""Audits: a share of semantic hits judged and asked again of the model, to measure what the cache serves.

A semantic hit is answered at once from the cache. With probability `cache_audit_share` the same
request is also queued in the batch lane (behind all interactive work, preempted for it) under
its own id and no key: never delivered, never cached, never charged. When it ends, the served
answer is judged against the asked question (cache/evidence.judge: the verdict, evidence that
moves the thresholds and the random sample behind the error rate `brigade cache stats` estimates),
and the model's answer is compared with the served one (`same_as_model`: how often the model
itself would have said otherwise, reported beside it, never counted as an error).
"""
from __future__ import annotations

import asyncio
import logging
import random
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable

from cache.evidence import judge, observed
from gateway import metrics
from gateway.admission.catalog import Choice
from gateway.admission.request_store import RequestStore
from gateway.delivery.events import ClientEvent
from gateway.delivery.router import ReplyRouter, Route, Sink
from ops.core.messages import QueuedRequest, ReplyEvent
from ops.core.settings import CacheSettings

if TYPE_CHECKING:  # not at run time: the cache brings the embedding model (and torch) with it
    from cache.answer_cache import AnswerCache, Hit

log = logging.getLogger("brigade.gateway")


@dataclass
class AuditContext:
    """An audit's route: what was asked and served, to judge (and compare the model's answer with) when it ends."""

    entry_id: str
    cosine: float
    score: float | None
    served: str
    choice: Choice
    asked: str  # the asked question (the cache's), and the one the served answer was stored for
    stored: str


class AuditSink(Sink):
    """Where an audit's events go: nowhere. Its answer is only compared."""

    def send(self, event: ClientEvent) -> None:
        pass


class Audits:
    def __init__(self, settings: CacheSettings, router: ReplyRouter, store: RequestStore, spawn: Callable):
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

    async def start(self, served: QueuedRequest, hit: Hit, choice: Choice, asked: str) -> None:
        """`served`: the request as it would have been queued (its id is the audit's own); `asked`:
        its question as the cache read it."""
        rid = served.request_id
        context = AuditContext(hit.entry.entry_id, hit.similarity, hit.score, hit.entry.answer, choice,
                               asked, hit.entry.question)
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
        settings = self.cache.settings
        verdict = await asyncio.to_thread(judge, context.asked, context.stored, context.served, answer,
                                          self.cache.embedder, settings.cache_judge_margin,
                                          settings.cache_answer_agreement)
        await self.cache.observe(observed("audit", entry=context.entry_id, cosine=context.cosine, score=context.score,
                                          agreed=verdict.fits, same_as_model=verdict.same_as_model))
        metrics.CACHE_AUDITS.labels(context.choice.model, "agreed" if verdict.fits else "different").inc()
        log.info("event=cache_audit_measured entry=%s cosine=%.4f agreed=%s same_as_model=%s", context.entry_id,
                 context.cosine, verdict.fits, verdict.same_as_model)
