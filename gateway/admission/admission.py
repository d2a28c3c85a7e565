"""Admission, the one path in for every door: version, limits, guards, cache, load, enqueue.

A door (WebSocket, OpenAI HTTP, the page, a batch line) reads its input into a `Generate` and
calls `admit`. In order: the version it runs on is chosen once (gateway/admission/catalog.py) and
the sampling fields its client left unset are filled, once, with that version's defaults
(gateway/request.py's `runnable`); then the caller's key
limits (rate_limited), the prompt guards (content_blocked), the answer cache (a hit is answered
at once, after the output guards), the service's load (overloaded, no_workers); then the request
is recorded and queued with a route registered first, so a fast worker's first token finds its
way back, and its shadow copies are sent (gateway/admission/shadows.py). Every refusal is a ProtocolError
with a stable code, which each door renders in its own shape.

What happens to an admitted request afterwards (cancel, resume, settle) is gateway/admission/lifecycle.py's.
"""
from __future__ import annotations

import asyncio
import logging
import time
import uuid
from dataclasses import dataclass, field
from typing import Callable

import redis.asyncio as aioredis

from gateway import metrics
from gateway.admission.audits import Audits
from gateway.admission.cache_step import CacheStep
from gateway.admission.catalog import Catalog, Choice
from gateway.admission.content_guards import GuardInput, NamedGuard, first_refusal
from gateway.admission.lifecycle import Caller, RequestContext, RequestLifecycle
from gateway.admission.limits import KeyLimiter
from gateway.admission.load import LoadMonitor
from gateway.admission.request_store import RequestStore
from gateway.admission.routing import PrefixRouter
from gateway.admission.shadows import Shadows
from gateway.delivery.events import Done, Token
from gateway.delivery.router import ReplyRouter, Route, Sink
from gateway.request import Generate, ProtocolError, runnable
from ops.core import redis_keys, roster
from ops.rollout import outcomes
from ops.core.messages import QueuedRequest
from ops.core.redis_clients import through_failover
from ops.core.settings import Settings

log = logging.getLogger("brigade.gateway")


@dataclass(frozen=True)
class Admitted:
    request_id: str | None = None  # the server id, when queued
    cached: list[Token | Done] = field(default_factory=list)  # the whole answer, when the cache had it
    hit: object | None = None  # the cache hit (entry, layer, similarity), for feedback
    asked: str | None = None  # the question as the cache saw it, for feedback
    hit_request_id: str | None = None  # the server id a cache hit is answered under (never queued)
    model: str = ""
    version: str = ""  # the version that answers (x-brigade-model-version)

    @property
    def server_id(self) -> str | None:
        """The server's id of this request, queued or answered from the cache."""
        return self.request_id or self.hit_request_id


class Admission:
    def __init__(self, settings: Settings, redis: aioredis.Redis, router: ReplyRouter, load: LoadMonitor,
                 limiter: KeyLimiter, guards: list[NamedGuard], reply_channel: str, spawn: Callable,
                 deliver: Callable, *, store: RequestStore, shadows: Shadows, audits: Audits,
                 lifecycle: RequestLifecycle, catalog: Catalog, routing: PrefixRouter):
        self.settings = settings
        self.catalog = catalog
        self.redis = redis
        self.router = router
        self.load = load
        self.limiter = limiter
        self.guards = guards
        self.reply_channel = reply_channel
        self.store = store
        self.routing = routing  # which worker's own queue, if any (gateway/admission/routing.py)
        self.shadows = shadows
        self.audits = audits  # a share of semantic hits asked again of the model (gateway/admission/audits.py)
        self.lifecycle = lifecycle  # a refused or failed request's slot is freed, a cache hit settled
        self._spawn = spawn  # the gateway's: background work it waits for at shutdown
        self._deliver = deliver  # the gateway's: a routed event to its client
        # The answer cache's step: a hit answered at once, audits, feedback (gateway/admission/cache_step.py).
        self.cache_step = CacheStep(settings, catalog, guards, store, audits, lifecycle, reply_channel, spawn)

    async def admit(self, cmd: Generate, caller: Caller, sink: Sink, lane: str = "interactive",
                    store_answer: bool = True) -> Admitted:
        """`lane` batch: a batch job's line (queued behind interactive work, never refused for the
        queue's depth: the job's window bounds it). `store_answer` False: looked up in the answer
        cache, but its answer is not stored there."""
        choice = self._choose(cmd, caller)
        try:
            cmd = runnable(cmd, self.catalog.defaults_for(choice.model, choice.version), self.settings)
            admitted = await self._admit(cmd, caller, sink, lane, store_answer, choice)
        except ProtocolError:
            metrics.REQUESTS.labels(cmd.model, choice.version, caller.door, "refused").inc()
            raise
        metrics.REQUESTS.labels(cmd.model, choice.version, caller.door,
                                "queued" if admitted.request_id else "cached").inc()
        return admitted

    def _choose(self, cmd: Generate, caller: Caller) -> Choice:
        """The version this request runs on (gateway/admission/catalog.py): pinned, routed, or stable."""
        choice = self.catalog.route(cmd.model, cmd.version, caller.key.id if caller.key else None, cmd.user,
                                    cmd.prompt, cmd.messages)
        if choice.instead_of:
            # The routed version whose workers are gone is charged an error: what rolls it back.
            down = Choice(choice.model, choice.instead_of, "route")
            self._spawn(self.store.record(down, outcomes.Outcome(at=time.time(), error=True)))
        return choice

    async def _admit(self, cmd: Generate, caller: Caller, sink: Sink, lane: str, store_answer: bool,
                     choice: Choice) -> Admitted:
        rid = uuid.uuid4().hex
        guard_input = GuardInput(rid, cmd.model, self._prompt_text(cmd), cmd.messages,
                                 caller.key.name if caller.key else None)
        context = RequestContext(caller, guard_input, key_id=caller.key.id if caller.key else None,
                                 store_answer=store_answer, choice=choice)
        await self._within_limits(caller, rid, cmd)
        try:
            await self._check_prompt(guard_input, cmd.id)
            cached = await self.cache_step.look_up(cmd, context)
            if cached is not None:
                return Admitted(cached=cached.events, hit=cached.hit, asked=cached.asked,
                                hit_request_id=cached.request_id, model=choice.model, version=choice.version)
            await self._refuse_if_overloaded(cmd, lane, choice)
        except BaseException:
            self.lifecycle.release(caller, rid)
            raise
        queued = await self._enqueue(cmd, rid, context, sink, lane)
        if context.shadows:
            self.shadows.expect(rid, len(context.shadows))
        for version in context.shadows:
            self._spawn(self.shadows.start(queued, Choice(choice.model, version, "shadow")))
        return Admitted(request_id=rid, model=choice.model, version=choice.version)

    def _prompt_text(self, cmd: Generate) -> str | None:
        """The prompt as the guards read it: a token-id prompt decoded with the model's tokenizer. A
        gateway with guards but no tokenizer refuses such a prompt rather than let it pass unread."""
        if cmd.prompt_ids is None:
            return cmd.prompt
        renderer = self.cache_step.renderer
        tokenizer = renderer.tokenizer if renderer is not None else None
        if tokenizer is not None:
            return tokenizer.decode(cmd.prompt_ids)
        if self.guards:
            raise ProtocolError("unsupported_field", "token-id prompts need the model's tokenizer at the gateway "
                                "(its content guards read the prompt): send the prompt as text", cmd.id, "prompt")
        return None

    async def _within_limits(self, caller: Caller, rid: str, cmd: Generate) -> None:
        if caller.key is None:
            return
        client_id = cmd.id
        try:
            refusal = await through_failover(lambda: self.limiter.admit(caller.key, rid),
                                             self.settings.failover_budget_s)
        except aioredis.RedisError:
            raise ProtocolError("unavailable", "limits cannot be checked now; try again shortly", client_id,
                                retry_after_s=self.settings.retry_after_s) from None
        if refusal is not None:
            log.info("event=rate_limited key=%s client_id=%s why=%r", caller.key.id, client_id, refusal.message)
            metrics.RATE_LIMIT_REFUSALS.labels(cmd.model, refusal.limit).inc()
            raise ProtocolError(refusal.code, refusal.message, client_id, retry_after_s=refusal.retry_after_s)

    async def _check_prompt(self, data: GuardInput, client_id: str) -> None:
        if not self.guards:
            return
        refusal = await asyncio.to_thread(first_refusal, self.guards, data)
        if refusal is not None:
            log.info("event=content_blocked stage=prompt guard=%s client_id=%s", refusal.guard, client_id)
            metrics.CONTENT_BLOCKED.labels(data.model, "prompt").inc()
            raise ProtocolError("content_blocked", f"refused by guard {refusal.guard}: {refusal.reason}", client_id)

    async def _refuse_if_overloaded(self, cmd: Generate, lane: str, choice: Choice) -> None:
        retry = self.settings.retry_after_s
        if self.load.observed and not await self._served_now(choice):
            metrics.OVERLOAD_REFUSALS.labels(cmd.model, choice.version, "no_workers").inc()
            raise ProtocolError("no_workers", f"no worker is serving {choice.served} now; try again shortly", cmd.id,
                                retry_after_s=retry)
        if lane == "batch":
            return
        try:
            pipe = self.redis.pipeline(transaction=False)
            # queued batch lines wait behind, they do not count
            for name in redis_keys.interactive_lists(choice.model, choice.version):
                pipe.llen(name)
            depth = sum(await pipe.execute())
        except aioredis.RedisError:
            return  # the enqueue just after says `unavailable`
        limit = self.settings.max_queue_depth
        if depth >= limit:
            metrics.OVERLOAD_REFUSALS.labels(cmd.model, choice.version, "overloaded").inc()
            raise ProtocolError("overloaded", f"{depth} requests are waiting (the limit is {limit}); try again shortly",
                                cmd.id, retry_after_s=retry)
        if cmd.deadline_ms is not None:
            wait = self.load.estimated_wait_s(depth)
            if wait is not None and wait * 1000 > cmd.deadline_ms:
                metrics.OVERLOAD_REFUSALS.labels(cmd.model, choice.version, "overloaded").inc()
                raise ProtocolError(
                    "overloaded", f"the estimated wait ({wait:.1f} s) is longer than the deadline "
                    f"({cmd.deadline_ms} ms); try again shortly or allow more time", cmd.id, retry_after_s=retry)

    async def _served_now(self, choice: Choice) -> bool:
        """A live worker serves this version: the once-a-second view, asked again before refusing."""
        # Seen serving a moment ago: after a Sentinel failover the new primary may lack the
        # heartbeats for a beat or two, and the version is not workerless for that.
        if self.catalog.serving(choice.model, choice.version) or self.catalog.served_within(
                choice.model, choice.version, self.settings.failover_budget_s):
            return True
        try:
            statuses = await roster.live_workers_async(self.redis)
        except aioredis.RedisError:
            return True  # unknown: let the enqueue decide
        return any(s.get("model") == choice.model and (s.get("version") or "") == choice.version
                   and not s.get("draining") for s in statuses)

    async def _enqueue(self, cmd: Generate, rid: str, context: RequestContext, sink: Sink, lane: str) -> QueuedRequest:
        key = context.caller.key
        choice = context.choice
        queued = cmd.queued(rid, cmd.id, choice.model, choice.version, self.reply_channel, key.id if key else None,
                            lane)
        # Route first: a fast worker's first event must find its way back. It is held until the
        # request is really on the queue, so that `queued` is the first thing its client hears.
        # A shadow's answer is compared as one text: several choices interleave, so they are not shadowed.
        if not cmd.version and cmd.params.n == 1:
            context.shadows = [v for v in self.catalog.shadows(choice.model) if v != choice.version]
        # The answer is kept for the cache, the output guards, and to compare shadows' with.
        keep_text = context.cache_query is not None or bool(self.guards) or bool(context.shadows)
        route = Route(rid, cmd.id, sink, keep_text=keep_text, context=context, held=[], stored=asyncio.Event(),
                      queued=queued, model=choice.model, version=choice.version)
        self.router.add(route)
        try:
            routed = await self.routing.route(cmd, choice, lane, rid)
            await self.store.put(queued, routed.worker)
        except Exception as exc:  # Redis or broker down: this request fails, the door lives
            self.router.remove(rid)
            self.lifecycle.release(context.caller, rid)
            log.warning("event=enqueue_failed request_id=%s error=%r", rid, exc)
            self._spawn(self.store.stop(rid))  # the client was told it failed: it must not run later
            raise ProtocolError("unavailable", "the request could not be queued; try again shortly", cmd.id,
                                retry_after_s=self.settings.retry_after_s) from None
        finally:
            # A catch-up that met this route while it was being stored judges it now (after the
            # held deliveries below: this task runs on to its return before the waiter wakes).
            route.stored.set()
        log.info("event=enqueued request_id=%s client_id=%s door=%s routed=%s worker=%s", rid, cmd.id,
                 context.caller.door, routed.decision, routed.worker or "-")
        sink.queued(cmd.id, rid)
        held, route.held = route.held, None
        for delivery in held:
            self._deliver(delivery)
        return queued
