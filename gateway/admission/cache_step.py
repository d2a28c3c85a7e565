"""The answer cache's step of admission: a request looked up, a hit answered at once (after the
output guards) and settled, a share of semantic hits asked again of the model (gateway/admission/audits.py),
and a client's feedback that a served answer was wrong.

The cache arrives after the gateway starts (the embedding model loads in the background): until
`use_cache`, every request is a miss.
"""
from __future__ import annotations

import asyncio
import logging
import time
import uuid
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable

from cache.evidence import observed
from cache.query import PromptRenderer, make_query
from gateway import metrics
from gateway.admission.audits import Audits
from gateway.admission.catalog import Catalog, Choice
from gateway.admission.content_guards import NamedGuard
from gateway.admission.lifecycle import RequestContext, RequestLifecycle, output_refusal
from gateway.admission.request_store import RequestStore
from gateway.delivery.events import Done, Token, cached_events
from gateway.request import Generate, ProtocolError
from ops.rollout import outcomes
from ops.core.settings import Settings

if TYPE_CHECKING:  # not at run time: the cache brings the embedding model (and torch) with it
    from cache.answer_cache import AnswerCache

log = logging.getLogger("brigade.gateway")


@dataclass(frozen=True)
class CachedAnswer:
    events: list[Token | Done]  # the whole answer, in the events a generated one has
    hit: object  # the cache hit (entry, layer, similarity), for feedback
    asked: str  # the question as the cache saw it, for feedback
    request_id: str  # the server id the hit is answered under (never queued)


class CacheStep:
    def __init__(self, settings: Settings, catalog: Catalog, guards: list[NamedGuard], store: RequestStore,
                 audits: Audits, lifecycle: RequestLifecycle, reply_channel: str, spawn: Callable):
        self.settings = settings
        self.catalog = catalog
        self.guards = guards
        self.store = store
        self.audits = audits
        self.lifecycle = lifecycle  # a hit's usage is settled at once
        self.reply_channel = reply_channel  # an audit's answer comes back to this gateway
        self._spawn = spawn  # the gateway's: background work it waits for at shutdown
        self.cache: AnswerCache | None = None  # set once the answer cache has loaded
        self.renderer: PromptRenderer | None = None
        self._renderers: dict[str, PromptRenderer] = {}  # per served version: its own chat template

    def use_cache(self, cache: AnswerCache, renderer: PromptRenderer) -> None:
        """The answer cache (AnswerCache) and the prompt renderer its keys need, once both have loaded."""
        self.cache, self.renderer = cache, renderer

    @property
    def caching(self) -> bool:
        return self.cache is not None

    async def forget(self, hit, asked: str) -> bool:
        """A client's feedback that a cached answer (`hit`) was wrong for what it asked; True if evicted.
        A semantic hit's is evidence against its cosine too (cache/evidence.py)."""
        evicted = await self.cache.forget(hit.entry.entry_id, asked)
        if hit.layer == "semantic":
            await self.cache.observe(observed("feedback", entry=hit.entry.entry_id, cosine=hit.similarity,
                                              score=hit.score, agreed=False))
        return evicted

    async def look_up(self, cmd: Generate, context: RequestContext) -> CachedAnswer | None:
        """The request's answer from the cache, or None: a miss, caching off, or nothing to look up."""
        if self.cache is None or cmd.cache == "off" or cmd.prompt_ids is not None:
            return None  # a token-id prompt has no question to embed: the model answers it
        started = time.perf_counter()
        choice = context.choice
        try:
            renderer = await self._renderer_for(choice) if cmd.messages is not None else self.renderer
            # Keyed by the served version: each version's answers are its own (a new version's
            # users must not be served the old one's answers from the cache).
            query = make_query(renderer, choice.served, cmd.prompt, cmd.messages, cmd.params, cmd.cache,
                               cmd.cache_threshold, cmd.tools)
        except Exception as exc:  # a template that cannot render this input: no caching, no failure
            log.warning("event=cache_query_failed client_id=%s error=%r", cmd.id, exc)
            return None
        if query is None:
            return None
        lookup = await self.cache.lookup(query)
        metrics.CACHE_LOOKUPS.labels(cmd.model, choice.version).inc()
        context.cache_query, context.cache_lookup = query, lookup
        hit = lookup.hit
        if hit is None:
            return None
        metrics.CACHE_HITS.labels(cmd.model, choice.version, hit.layer).inc()
        entry = hit.entry
        text = "".join(entry.chunks)
        refusal = output_refusal(self.guards, context.guard_input, text, text)
        if refusal is not None:
            raise ProtocolError("content_blocked", refusal, cmd.id)
        usage = {"prompt_tokens": entry.prompt_tokens, "completion_tokens": entry.completion_tokens}
        rid = context.guard_input.request_id
        events = cached_events(cmd.id, entry.chunks, entry.finish_reason, usage, hit.layer, hit.similarity,
                               time.perf_counter() - started, entry.entry_id, request_id=rid, model=choice.model,
                               version=choice.version, continuous_usage=cmd.params.continuous_usage_stats)
        log.info("event=cache_hit request_id=%s client_id=%s layer=%s similarity=%.4f entry=%s", rid, cmd.id,
                 hit.layer, hit.similarity, entry.entry_id)
        self._spawn(self.lifecycle.settle_usage(context.key_id, rid, usage, cache_hit=True))
        if self.audits.due(hit):
            audit = uuid.uuid4().hex
            # No deadline: an audit waits behind interactive work for as long as it takes.
            queued = cmd.queued(audit, audit, choice.model, choice.version, self.reply_channel,
                                lane="batch").model_copy(update={"deadline_at": None})
            self._spawn(self.audits.start(queued, hit, choice, query.question))
        self._spawn(self.store.record(choice, outcomes.Outcome(at=time.time(), cached=True)))
        return CachedAnswer(events, hit, query.question, rid)

    async def _renderer_for(self, choice: Choice) -> PromptRenderer:
        """The chat template of the chosen version (its folder's tokenizer files, when this machine
        has them; else canonical JSON of the messages, which costs a miss, never a wrong hit)."""
        folder = self.catalog.folder(choice.model, choice.version)
        if folder is not None and folder.resolve() == self.settings.model_dir.resolve() and self.renderer is not None:
            return self.renderer
        key = str(folder)
        if key not in self._renderers:
            self._renderers[key] = await asyncio.to_thread(PromptRenderer, folder or "/nonexistent")
        return self._renderers[key]
