"""A request's life after admission: ending early, resuming, and settling when it ends.

A request ends before its worker ends it when its client cancels (`cancel`), leaves for good
(`abandon`, `hold_for_resume`) or is refused mid-answer (`refuse_midway`): each removes its route,
stops the request everywhere and settles it, in one sequence for every door. A request is
followed again from its replay log by `resume` (a WebSocket client's, on any gateway) or
`follow_again` (a batch line whose runner stopped).

`settle` is the other end: when a route ends (done, error, cancel, abandoned) the key's
concurrency slot is released and its usage counted, a finished answer is stored in the cache, the
version's outcome recorded, and a served answer compared with its shadows (gateway/admission/shadows.py).

The delivery rule lives here too (`deliver`: each routed event to its client, the output guards'
verdict first, `output_refusal`, one check for a streamed answer and a cached one alike; the
request settled once its last event is out). The reply intake and admission hand it their
deliveries.
"""
from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable

import redis.asyncio as aioredis

from cache.query import CacheQuery
from gateway import metrics
from gateway.admission.api_keys import ApiKey, KeyStore
from gateway.admission.audits import AuditContext, Audits
from gateway.admission.catalog import Choice
from gateway.admission.content_guards import GuardInput, NamedGuard, first_refusal
from gateway.admission.limits import KeyLimiter
from gateway.admission.request_store import RequestStore
from gateway.admission.shadows import ShadowContext, Shadows
from gateway.delivery.events import StreamError, Token
from gateway.delivery.replies import ReplyIntake
from gateway.delivery.router import Delivery, ReplyRouter, Route, Sink
from gateway.request import ProtocolError
from ops.core import redis_keys
from ops.rollout import outcomes
from ops.core.messages import QueuedRequest, ReplyEvent
from ops.core.settings import Settings

if TYPE_CHECKING:  # not at run time: the cache brings the embedding model (and torch) with it
    from cache.answer_cache import AnswerCache, Lookup

log = logging.getLogger("brigade.gateway")


@dataclass(frozen=True)
class Caller:
    """Who asks: the API key (None when keys are off) and the door it came through."""

    key: ApiKey | None = None
    door: str = "ws"


@dataclass
class RequestContext:
    """What admission knows of a request, kept on its route until it is settled."""

    caller: Caller
    guard_input: GuardInput
    cache_query: CacheQuery | None = None
    cache_lookup: Lookup | None = None  # what the cache found (the vector, a short pool, a near miss)
    key_id: str | None = None  # the key charged at the end (the caller's, or the resumed request's)
    settled: bool = False
    store_answer: bool = True  # into the answer cache when it ends (batch lines without --warm-cache: no)
    choice: Choice | None = None  # the model version it was routed to
    shadows: list[str] = field(default_factory=list)  # versions given a shadow copy (compared with its answer)


def output_refusal(guards: list[NamedGuard], data: GuardInput, answer: str, new_text: str) -> str | None:
    """The output guards' verdict on an answer so far (`new_text` its newest part; a cached answer
    is all new): None, or the refusal message its client is given."""
    if not guards:
        return None
    refusal = first_refusal(guards, GuardInput(data.request_id, data.model, data.prompt, data.messages,
                                               data.key_name, answer, new_text))
    if refusal is None:
        return None
    log.info("event=content_blocked stage=output guard=%s request_id=%s", refusal.guard, data.request_id)
    metrics.CONTENT_BLOCKED.labels(data.model, "output").inc()
    return f"refused by guard {refusal.guard}: {refusal.reason}"


class RequestLifecycle:
    def __init__(self, settings: Settings, redis: aioredis.Redis, router: ReplyRouter, intake: ReplyIntake,
                 store: RequestStore, shadows: Shadows, key_store: KeyStore, limiter: KeyLimiter,
                 guards: list[NamedGuard], spawn: Callable, audits: Audits | None = None):
        self.settings = settings
        self.redis = redis
        self.router = router
        self.intake = intake
        self.store = store
        self.shadows = shadows
        self.audits = audits
        self.key_store = key_store
        self.limiter = limiter
        self.guards = guards
        self._spawn = spawn  # the gateway's: background work it waits for at shutdown
        self.cache: AnswerCache | None = None  # set once the answer cache has loaded

    def use_cache(self, cache: AnswerCache) -> None:
        self.cache = cache

    def deliver(self, delivery: Delivery) -> None:
        """One routed event to its client: output guards first, then settle the request if it ended."""
        route = delivery.route
        if route.held is not None:
            route.held.append(delivery)  # not yet confirmed queued: admission sends it after `queued`
            return
        try:
            if isinstance(delivery.event, Token):
                refusal = self.output_refusal(route, delivery.reply.text or "")
                if refusal is not None:
                    self.refuse_midway(route, "content_blocked", refusal)
                    return
            route.sink.send(delivery.event)
            if delivery.ended:
                route.sink.ended(route.client_id)
                self.settle(route, delivery.reply)
        except Exception:  # a bug (or a plugged-in guard) on one request must not stall every stream
            log.exception("event=delivery_failed request_id=%s", route.request_id)
            self.refuse_midway(route, "internal_error", "the gateway failed on this request")

    def output_refusal(self, route: Route, new_text: str) -> str | None:
        """The output guards' verdict on a route's answer so far: None, or the refusal message."""
        if not self.guards or not isinstance(route.context, RequestContext):
            return None
        return output_refusal(self.guards, route.context.guard_input, route.text, new_text)

    # ---- ending early -----------------------------------------------------------------------------
    # One sequence for every door: the route goes, the request stops everywhere (queued, it never
    # runs; running, it frees its slot), and its key is settled with what it generated so far.

    def cancel(self, rid: str, sink: Sink | None) -> None:
        """A client's `cancel`: the request stops even when this gateway no longer routes it there
        (None: whichever sink it has here, if any)."""
        route = self.router.remove(rid, sink)
        if route is None:
            self._spawn(self.store.stop(rid))
        else:
            self._end(route)

    def abandon(self, rid: str | None, sink: Sink) -> None:
        """A client that cannot resume (HTTP, a stopped batch job's line) went away."""
        route = self.router.remove(rid, sink) if rid else None
        if route is None:
            return
        self._end(route)
        log.info("event=client_gone request_id=%s", rid)

    def refuse_midway(self, route: Route, code: str, message: str) -> None:
        """End an answer that is already streaming (an output guard refused it, or the gateway
        failed on it): its client is told why."""
        if self.router.remove(route.request_id, route.sink) is None:
            return
        self._end(route)
        route.sink.send(StreamError(route.client_id, code, message))
        route.sink.ended(route.client_id)

    def hold_for_resume(self, rid: str, sink: Sink) -> None:
        """A WebSocket client left: it may come back with `resume` (to any gateway) within the
        grace time; after it, its request stops."""
        route = self.router.remove(rid, sink)
        if route is not None:
            self._spawn(self._end_unless_resumed(route))

    async def _end_unless_resumed(self, route: Route) -> None:
        await asyncio.sleep(self.settings.resume_grace_s)
        try:
            resumed_at = await self.redis.get(redis_keys.resumed(route.request_id))
        except aioredis.RedisError:
            resumed_at = None
        # A resume after this connection took the request on means the client is back
        # elsewhere, even if it came back before this connection was seen to close.
        if resumed_at is not None and float(resumed_at) > route.since:
            return
        self._end(route)
        log.info("event=abandoned request_id=%s", route.request_id)

    def _end(self, route: Route) -> None:
        self._spawn(self.store.stop(route.request_id))
        self.settle(route, None)

    # ---- resuming ---------------------------------------------------------------------------------

    async def resume(self, rid: str, caller: Caller, sink: Sink, after_index: int) -> bool:
        """A client's `resume` of a request (queued by any gateway): followed from its replay log
        after `after_index`. False when it was cancelled (its client did not come back within the
        grace time, or cancelled it): it will not finish."""
        try:
            record = await self.redis.get(redis_keys.request(rid))
            queued = QueuedRequest.model_validate_json(record) if record is not None else None
            known = record is not None or bool(await self.redis.exists(redis_keys.stream(rid)))
            if caller.key is not None and (queued is None or queued.api_key != caller.key.id):
                known = False  # another key's request reads as unknown: its id is no ticket to its answer
            cancelled = known and bool(await self.redis.exists(redis_keys.cancelled(rid)))
            if known and not cancelled:
                await self.redis.set(redis_keys.resumed(rid), str(time.time()), ex=redis_keys.resumed_ttl_s(self.settings))
        except aioredis.RedisError:
            raise ProtocolError("unavailable", "the replay log cannot be read now; try again shortly", rid) from None
        if not known:
            raise ProtocolError("unknown_request", f"no request {rid!r} is known (or its replay log expired)", rid, "id")
        if cancelled:
            return False
        # The key the request was admitted under is charged and released when it ends here; the
        # output guards read the whole answer (the route keeps what came before `after_index`).
        guard_input = (GuardInput(rid, queued.model, queued.prompt, queued.messages) if queued is not None
                       else GuardInput(rid, self.settings.model_name, None, None))
        choice = Choice(queued.model, queued.version, "resumed") if queued is not None else None
        context = RequestContext(caller, guard_input, key_id=queued.api_key if queued else None, choice=choice)
        self.intake.follow(Route(rid, rid, sink, next_index=after_index + 1, context=context,
                                 keep_text=bool(self.guards), model=choice.model if choice else "",
                                 version=choice.version if choice else ""))
        log.info("event=resumed request_id=%s after_index=%d", rid, after_index)
        return True

    async def follow_again(self, rid: str, client_id: str, sink: Sink) -> bool:
        """A request queued before (a batch line whose runner stopped), followed from its replay
        log. False when it has none (it expired, or Redis lost it): the line is queued anew."""
        if not await self.redis.exists(redis_keys.stream(rid), redis_keys.request(rid)):
            return False
        self.intake.follow(Route(rid, client_id, sink, keep_text=True))
        return True

    # ---- settling ---------------------------------------------------------------------------------

    def settle(self, route: Route, reply: ReplyEvent | None) -> None:
        """A route ended (`reply` is its done or error event; None when cancelled or abandoned)."""
        context = route.context
        if isinstance(context, ShadowContext):
            self.shadows.ended(route, reply)
            return
        if isinstance(context, AuditContext):
            self.audits.ended(route, reply)
            return
        if not isinstance(context, RequestContext) or context.settled:
            return
        context.settled = True
        done = reply is not None and reply.type == "done"
        if context.shadows:
            self.shadows.served_ended(route.request_id, route.text if done else None)
        if reply is not None and context.choice is not None:
            self._spawn(self.store.record(context.choice, outcomes.from_timing(reply.timing, reply.usage,
                                                                               error=not done)))
        usage = (reply.usage if reply is not None else None) or {}
        if not done:
            # Stopped early (cancel, client gone, refused): what it generated still counts,
            # as far as this gateway saw it.
            usage = {"prompt_tokens": 0, "completion_tokens": route.next_index}
        if done and context.cache_query is not None and self.cache is not None \
                and context.store_answer and reply.finish_reason in ("stop", "length"):
            self._spawn(self.cache.insert(context.cache_query, context.cache_lookup, route.chunks, reply.finish_reason,
                                          usage.get("prompt_tokens", 0), usage.get("completion_tokens", 0)))
        self._spawn(self.settle_usage(context.key_id, route.request_id, usage, cache_hit=False))

    async def settle_usage(self, key_id: str | None, rid: str, usage: dict, cache_hit: bool) -> None:
        if key_id is None:
            return
        prompt, completion = int(usage.get("prompt_tokens", 0)), int(usage.get("completion_tokens", 0))
        try:
            await self.limiter.release(key_id, rid)
            # Once per request, whichever gateway sees its end first: a half-open old connection
            # and a resumed one may both receive the same `done`.
            if not await self.redis.set(redis_keys.settled(rid), "1", nx=True, ex=redis_keys.settled_ttl_s(self.settings)):
                return
            await self.key_store.record_usage(key_id, prompt, completion, cache_hit)
            if not cache_hit:  # a cached answer cost no compute: it does not count against tokens per minute
                await self.limiter.charge_tokens(key_id, prompt + completion)
        except aioredis.RedisError as exc:  # the slot expires by itself (KeyLimiter's stale age)
            log.warning("event=usage_not_recorded key=%s request_id=%s error=%r", key_id, rid, exc)

    def release(self, caller: Caller, rid: str) -> None:
        """A request refused or failed after its key's slot was taken: the slot is freed."""
        if caller.key is not None:
            self._spawn(self.release_slot(caller.key.id, rid))

    async def release_slot(self, key_id: str, rid: str) -> None:
        try:
            await self.limiter.release(key_id, rid)
        except aioredis.RedisError as exc:
            log.warning("event=slot_not_released key=%s request_id=%s error=%r", key_id, rid, exc)
