"""One admission path for every door: limits, guards, cache, load, enqueue; ending early, resuming, settling.

A door (WebSocket, OpenAI HTTP, the page) turns its input into a `Generate` and calls `admit`.
In order: the caller's key limits (rate_limited), the prompt guards (content_blocked), the
answer cache (a hit is answered at once, after the output guards), the service's load
(overloaded, no_workers), then the request is recorded and queued with a route registered
first, so a fast worker's first token finds its way back. Every refusal is a ProtocolError with
a stable code, which each door renders in its own shape.

A request ends before its worker ends it when its client cancels (`cancel`), leaves for good
(`abandon`, `hold_for_resume`) or is refused mid-answer (`refuse_midway`): each removes its route,
stops the request everywhere and settles it, in one sequence for every door. A request is
followed again from its replay log by `resume` (a WebSocket client's, on any gateway) or
`follow_again` (a batch line whose runner stopped).

`settle` is the other end: when a route ends (done, error, cancel, abandoned) the key's
concurrency slot is released and its usage counted, and a finished answer is stored in the cache.
"""
from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import secrets
import time
import uuid
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable

import numpy as np
import redis.asyncio as aioredis

from cache.query import CacheQuery, PromptRenderer, make_query
from gateway import metrics
from gateway.api_keys import ApiKey, KeyStore
from gateway.catalog import Catalog, Choice
from gateway.content_guards import GuardInput, NamedGuard, first_refusal
from gateway.limits import KeyLimiter
from gateway.load import LoadMonitor
from gateway.events import cached_events, stream_error
from gateway.protocol import Generate, ProtocolError
from gateway.replies import ReplyIntake
from gateway.router import ReplyRouter, Route, Sink
from ops.core import fleet, keys, outcomes, registry
from ops.core.messages import QueuedRequest, ReplyEvent
from ops.core.queue import SEND_ERRORS, enqueue
from ops.core.redis_clients import through_failover
from ops.core.settings import Settings

if TYPE_CHECKING:  # not at run time: the cache brings the embedding model (and torch) with it
    from cache.answer_cache import AnswerCache

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
    cache_vector: np.ndarray | None = None
    key_id: str | None = None  # the key charged at the end (the caller's, or the resumed request's)
    settled: bool = False
    store_answer: bool = True  # into the answer cache when it ends (batch lines without --warm-cache: no)
    choice: Choice | None = None  # the model version it was routed to
    shadows: list[str] = field(default_factory=list)  # versions given a shadow copy (compared with its answer)


@dataclass
class ShadowContext:
    """A shadow copy's route: measured when it ends, compared with the served answer, never delivered."""

    primary: str  # the served request's id
    choice: Choice


class ShadowSink:
    """Where a shadow's events go: nowhere. Its answer is only measured."""

    def send(self, event: dict) -> None:
        pass

    def queued(self, client_id: str, request_id: str) -> None:
        pass

    def ended(self, client_id: str) -> None:
        pass


@dataclass
class ShadowPair:
    """A served answer and its shadows' outcomes, until both sides have ended."""

    shadows: int = 0  # shadow copies not yet measured
    served_text: str | None = None
    served_ended: bool = False
    waiting: list = field(default_factory=list)  # (shadow choice, its outcome, its text) before the served one ended
    at: float = field(default_factory=time.time)


@dataclass(frozen=True)
class Admitted:
    request_id: str | None = None  # the server id, when queued
    cached: list[dict] = field(default_factory=list)  # the whole answer, when the cache had it
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
    def __init__(self, settings: Settings, redis: aioredis.Redis, router: ReplyRouter, intake: ReplyIntake,
                 load: LoadMonitor, key_store: KeyStore, limiter: KeyLimiter, guards: list[NamedGuard],
                 reply_channel: str, spawn: Callable, deliver: Callable, catalog: Catalog | None = None):
        self.settings = settings
        self.catalog = catalog
        self.redis = redis
        self.router = router
        self.intake = intake
        self.load = load
        self.key_store = key_store
        self.limiter = limiter
        self.guards = guards
        self.reply_channel = reply_channel
        self._spawn = spawn  # the gateway's: background work it waits for at shutdown
        self._deliver = deliver  # the gateway's: a routed event to its client
        self.cache: AnswerCache | None = None  # set once the answer cache has loaded
        self.renderer: PromptRenderer | None = None
        self._renderers: dict[str, PromptRenderer] = {}  # per served version: its own chat template
        self._shadow_pairs: dict[str, ShadowPair] = {}  # served request id -> its shadows' comparison

    def use_cache(self, cache: AnswerCache, renderer: PromptRenderer) -> None:
        """The answer cache (AnswerCache) and the prompt renderer its keys need, once both have loaded."""
        self.cache, self.renderer = cache, renderer

    @property
    def caching(self) -> bool:
        return self.cache is not None

    async def forget(self, entry_id: str, asked: str) -> bool:
        """A client's feedback that a cached answer was wrong for what it asked; True if evicted."""
        return await self.cache.forget(entry_id, asked)

    # ---- in ---------------------------------------------------------------------------------------

    async def admit(self, cmd: Generate, caller: Caller, sink: Sink, lane: str = "interactive",
                    store_answer: bool = True) -> Admitted:
        """`lane` batch: a batch job's line (queued behind interactive work, never refused for the
        queue's depth: the job's window bounds it). `store_answer` False: looked up in the answer
        cache, but its answer is not stored there."""
        choice = self._choose(cmd, caller)
        cmd = self._with_version_defaults(cmd, choice)
        try:
            admitted = await self._admit(cmd, caller, sink, lane, store_answer, choice)
        except ProtocolError:
            metrics.REQUESTS.labels(cmd.model, choice.version, caller.door, "refused").inc()
            raise
        metrics.REQUESTS.labels(cmd.model, choice.version, caller.door,
                                "queued" if admitted.request_id else "cached").inc()
        return admitted

    def _choose(self, cmd: Generate, caller: Caller) -> Choice:
        """The version this request runs on (gateway/catalog.py): pinned, routed, or stable."""
        if self.catalog is None:
            return Choice(cmd.model, cmd.version, "settings")
        conversation = registry.conversation_of(cmd.prompt, [m.model_dump() for m in cmd.messages]
                                                if cmd.messages is not None else None)
        choice = self.catalog.choose(cmd.model, cmd.version, caller.key.id if caller.key else None, cmd.user,
                                     conversation)
        if choice.why == "route" and not self.catalog.serving(choice.model, choice.version):
            fallback = self.catalog.snapshot.stable.get(cmd.model)
            if fallback and fallback != choice.version and self.catalog.serving(cmd.model, fallback):
                # A routed version with no live worker must not cost its users their answers: the
                # request runs on the stable version, and the routed one is charged an error, which
                # is what rolls a canary whose workers are gone back.
                log.warning("event=routed_version_down model=%s version=%s served_by=%s", cmd.model,
                            choice.version, fallback)
                self._spawn(self._record(choice, outcomes.Outcome(at=time.time(), error=True)))
                return Choice(cmd.model, fallback, "stable, routed version down")
        return choice

    def _with_version_defaults(self, cmd: Generate, choice: Choice) -> Generate:
        """Fields the client left unset, filled again from the chosen version's defaults when they
        differ from the ones the protocol used (the stable version's)."""
        if self.catalog is None or not cmd.unset or choice.version == cmd.version:
            return cmd
        defaults = self.catalog.defaults_for(choice.model, choice.version)
        update = {name: getattr(defaults, name) for name in cmd.unset}
        if all(getattr(cmd.params, name) == value for name, value in update.items()):
            return cmd
        return dataclasses.replace(cmd, params=cmd.params.model_copy(update=update))

    async def _admit(self, cmd: Generate, caller: Caller, sink: Sink, lane: str, store_answer: bool,
                     choice: Choice) -> Admitted:
        rid = uuid.uuid4().hex
        guard_input = GuardInput(rid, cmd.model, cmd.prompt, cmd.messages, caller.key.name if caller.key else None)
        context = RequestContext(caller, guard_input, key_id=caller.key.id if caller.key else None,
                                 store_answer=store_answer, choice=choice)
        await self._within_limits(caller, rid, cmd)
        try:
            await self._check_prompt(guard_input, cmd.id)
            hit = await self._look_up(cmd, context)
            if hit is not None:
                return hit
            await self._refuse_if_overloaded(cmd, lane, choice)
        except BaseException:
            self._release(caller, rid)
            raise
        queued = await self._enqueue(cmd, rid, context, sink, lane)
        if context.shadows:
            # Before the shadows are sent: a served answer that ends first must find its pair.
            self._shadow_pairs[rid] = ShadowPair(shadows=len(context.shadows))
        for version in context.shadows:
            self._spawn(self._shadow(queued, Choice(choice.model, version, "shadow")))
        return Admitted(request_id=rid, model=choice.model, version=choice.version)

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

    def output_refusal(self, route: Route, new_text: str) -> str | None:
        """The output guards' verdict on a route's answer so far: None, or the refusal message."""
        if not self.guards or not isinstance(route.context, RequestContext):
            return None
        data = route.context.guard_input
        refusal = first_refusal(self.guards, GuardInput(
            data.request_id, data.model, data.prompt, data.messages, data.key_name, route.text, new_text))
        if refusal is None:
            return None
        log.info("event=content_blocked stage=output guard=%s request_id=%s", refusal.guard, route.request_id)
        metrics.CONTENT_BLOCKED.labels(data.model, "output").inc()
        return f"refused by guard {refusal.guard}: {refusal.reason}"

    async def _look_up(self, cmd: Generate, context: RequestContext) -> Admitted | None:
        if self.cache is None or cmd.cache == "off":
            return None
        started = time.perf_counter()
        choice = context.choice
        try:
            renderer = await self._renderer_for(choice) if cmd.messages is not None else self.renderer
            # Keyed by the served version: each version's answers are its own (a new version's
            # users must not be served the old one's answers from the cache).
            query = make_query(renderer, choice.served, cmd.prompt, cmd.messages, cmd.params, cmd.cache,
                               cmd.cache_threshold)
        except Exception as exc:  # a template that cannot render this input: no caching, no failure
            log.warning("event=cache_query_failed client_id=%s error=%r", cmd.id, exc)
            return None
        if query is None:
            return None
        lookup = await self.cache.lookup(query)
        metrics.CACHE_LOOKUPS.labels(cmd.model, choice.version).inc()
        context.cache_query, context.cache_vector = query, lookup.vector
        hit = lookup.hit
        if hit is None:
            return None
        metrics.CACHE_HITS.labels(cmd.model, choice.version, hit.layer).inc()
        entry = hit.entry
        text = "".join(entry.chunks)
        if self.guards:
            data = context.guard_input
            refusal = first_refusal(self.guards, GuardInput(data.request_id, data.model, data.prompt, data.messages,
                                                            data.key_name, text, text))
            if refusal is not None:
                metrics.CONTENT_BLOCKED.labels(cmd.model, "output").inc()
                raise ProtocolError("content_blocked", f"refused by guard {refusal.guard}: {refusal.reason}", cmd.id)
        usage = {"prompt_tokens": entry.prompt_tokens, "completion_tokens": entry.completion_tokens}
        rid = context.guard_input.request_id
        events = cached_events(cmd.id, entry.chunks, entry.finish_reason, usage, hit.layer, hit.similarity,
                               time.perf_counter() - started, entry.entry_id, request_id=rid, model=choice.model,
                               version=choice.version)
        log.info("event=cache_hit request_id=%s client_id=%s layer=%s similarity=%.4f entry=%s", rid, cmd.id,
                 hit.layer, hit.similarity, entry.entry_id)
        self._spawn(self._settle_usage(context.key_id, rid, usage, cache_hit=True))
        self._spawn(self._record(choice, outcomes.Outcome(at=time.time(), cached=True)))
        return Admitted(cached=events, hit=hit, asked=query.question, hit_request_id=rid, model=choice.model,
                        version=choice.version)

    async def _renderer_for(self, choice: Choice) -> PromptRenderer:
        """The chat template of the chosen version (its folder's tokenizer files, when this machine
        has them; else canonical JSON of the messages, which costs a miss, never a wrong hit)."""
        if self.catalog is None:
            return self.renderer
        folder = self.catalog.folder(choice.model, choice.version)
        if folder is not None and folder.resolve() == self.settings.model_dir.resolve() and self.renderer is not None:
            return self.renderer
        key = str(folder)
        if key not in self._renderers:
            self._renderers[key] = await asyncio.to_thread(PromptRenderer, folder or "/nonexistent")
        return self._renderers[key]

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
            for name in keys.interactive_lists(choice.model, choice.version):
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
        if self.catalog is None:
            return self.load.workers > 0 or await self.load.any_worker_alive()
        # Seen serving a moment ago: after a Sentinel failover the new primary may lack the
        # heartbeats for a beat or two, and the version is not workerless for that.
        if self.catalog.serving(choice.model, choice.version) or self.catalog.served_within(
                choice.model, choice.version, self.settings.failover_budget_s):
            return True
        try:
            statuses = await fleet.live_workers_async(self.redis)
        except aioredis.RedisError:
            return True  # unknown: let the enqueue decide
        return any(s.get("model") == choice.model and (s.get("version") or "") == choice.version
                   and not s.get("draining") for s in statuses)

    async def _enqueue(self, cmd: Generate, rid: str, context: RequestContext, sink: Sink, lane: str) -> QueuedRequest:
        params = cmd.params
        if params.temperature > 0 and params.seed is None:
            # Drawn here, once: a worker that continues this request after a crash samples the
            # same random stream, so the answer is the one an uninterrupted run would give.
            params = params.model_copy(update={"seed": secrets.randbits(63)})
        now = time.time()
        key = context.caller.key
        choice = context.choice
        queued = QueuedRequest(
            request_id=rid, client_id=cmd.id, reply_channel=self.reply_channel, enqueued_at=now, model=choice.model,
            version=choice.version, prompt=cmd.prompt, messages=cmd.messages, params=params,
            deadline_at=now + cmd.deadline_ms / 1000 if cmd.deadline_ms else None,
            api_key=key.id if key else None, lane=lane,
        )
        # Route first: a fast worker's first event must find its way back. It is held until the
        # request is really on the queue, so that `queued` is the first thing its client hears.
        if self.catalog is not None and not cmd.version:
            context.shadows = [v for v in self.catalog.shadows(choice.model) if v != choice.version]
        # The answer is kept for the cache, the output guards, and to compare shadows' with.
        keep_text = context.cache_query is not None or bool(self.guards) or bool(context.shadows)
        route = Route(rid, cmd.id, sink, keep_text=keep_text, context=context, held=[], model=choice.model,
                      version=choice.version)
        self.router.add(route)
        try:
            await self._put_on_queue(queued)
        except Exception as exc:  # Redis or broker down: this request fails, the door lives
            self.router.remove(rid)
            self._release(context.caller, rid)
            log.warning("event=enqueue_failed request_id=%s error=%r", rid, exc)
            self._spawn(self.stop(rid))  # the client was told it failed: it must not run later
            raise ProtocolError("unavailable", "the request could not be queued; try again shortly", cmd.id,
                                retry_after_s=self.settings.retry_after_s) from None
        log.info("event=enqueued request_id=%s client_id=%s door=%s", rid, cmd.id, context.caller.door)
        sink.queued(cmd.id, rid)
        held, route.held = route.held, None
        for delivery in held:
            self._deliver(delivery)
        return queued

    async def _put_on_queue(self, queued: QueuedRequest) -> None:
        """The request's record (for a resume, a reaper, a continuing worker), its unclaimed mark
        (the reaper's way to find a message lost before its claim), then the message itself."""
        rid = queued.request_id

        async def put() -> None:
            pipe = self.redis.pipeline(transaction=False)
            pipe.set(keys.request(rid), json.dumps(queued.model_dump(mode="json")), ex=keys.request_ttl_s(self.settings))
            pipe.zadd(keys.UNCLAIMED, {rid: queued.enqueued_at})
            if self.settings.confirmations:
                # On a replica before the message goes: should a failover lose the message, the
                # record and the mark survive it, and the reaper sends the request again.
                pipe.execute_command("WAIT", self.settings.confirmations, self.settings.confirm_ms)
            await pipe.execute()
            await asyncio.to_thread(enqueue, queued, True)

        # Through a Sentinel failover the request waits for the new primary instead of failing; a
        # second message after a send that failed late is a duplicate delivery, which the claim skips.
        await through_failover(put, self.settings.failover_budget_s, SEND_ERRORS)

    # ---- shadows ----------------------------------------------------------------------------------
    # A shadow copy runs the served request on another version, in the batch lane (behind all
    # interactive work, preempted for it), under its own id and no key: it is never delivered,
    # never cached, never charged. Its latency, error and whether its text equals the served
    # answer go into its version's outcomes and the shadow counter.

    async def _shadow(self, served: QueuedRequest, choice: Choice) -> None:
        rid = uuid.uuid4().hex
        queued = served.model_copy(update={"request_id": rid, "client_id": rid, "version": choice.version,
                                           "enqueued_at": time.time(), "lane": "batch", "api_key": None,
                                           "deadline_at": None, "shadow_of": served.request_id})
        self.router.add(Route(rid, rid, ShadowSink(), keep_text=True, context=ShadowContext(served.request_id, choice),
                              model=choice.model, version=choice.version))
        try:
            await self._put_on_queue(queued)
        except Exception as exc:
            self.router.remove(rid)
            log.warning("event=shadow_not_queued request_id=%s version=%s error=%r", served.request_id,
                        choice.version, exc)
            metrics.SHADOW_REQUESTS.labels(choice.model, choice.version, "not_queued").inc()
            self._one_less(served.request_id)
            return
        log.info("event=shadow_queued request_id=%s shadow=%s version=%s", served.request_id, rid, choice.version)

    def _shadow_ended(self, route: Route, reply: ReplyEvent | None) -> None:
        context: ShadowContext = route.context
        if reply is None:  # stopped without an answer: nothing to measure
            self._one_less(context.primary)
            return
        error = reply.type != "done"
        outcome = outcomes.from_timing(reply.timing, reply.usage, error=error, shadow=True)
        pair = self._shadow_pairs.get(context.primary)
        if pair is not None and not pair.served_ended:
            pair.waiting.append((context.choice, outcome, None if error else route.text))
            return
        self._shadow_measured(context.choice, outcome, None if error else route.text,
                              pair.served_text if pair is not None else None)
        self._one_less(context.primary)

    def _served_ended(self, rid: str, text: str | None) -> None:
        """The served answer ended (text None: it failed or stopped): its shadows can be compared."""
        pair = self._shadow_pairs.get(rid)
        if pair is None:
            return
        pair.served_ended, pair.served_text = True, text
        waiting, pair.waiting = pair.waiting, []
        for choice, outcome, shadow_text in waiting:
            self._shadow_measured(choice, outcome, shadow_text, text)
        self._one_less(rid, len(waiting))
        self._forget_old_pairs()

    def _one_less(self, rid: str, measured: int = 1) -> None:
        """`measured` more of a pair's shadows are done with: the pair goes once all are and its
        served answer ended."""
        pair = self._shadow_pairs.get(rid)
        if pair is None:
            return
        pair.shadows -= measured
        if pair.shadows <= 0 and pair.served_ended:
            del self._shadow_pairs[rid]

    def _shadow_measured(self, choice: Choice, outcome: outcomes.Outcome, shadow_text: str | None,
                         served_text: str | None) -> None:
        same = None if shadow_text is None or served_text is None else shadow_text == served_text
        outcome = dataclasses.replace(outcome, same_text=same)
        result = "error" if outcome.error else "unknown" if same is None else "same" if same else "different"
        metrics.SHADOW_REQUESTS.labels(choice.model, choice.version, result).inc()
        log.info("event=shadow_measured model=%s version=%s result=%s e2e_s=%s", choice.model, choice.version,
                 result, outcome.e2e_s)
        self._spawn(self._record(choice, outcome))

    def _forget_old_pairs(self) -> None:
        """A pair whose shadows never ended (their worker died for good) goes after the replay log's life."""
        horizon = time.time() - keys.stream_ttl_s(self.settings)
        for rid in [rid for rid, pair in self._shadow_pairs.items() if pair.at < horizon]:
            del self._shadow_pairs[rid]

    async def _record(self, choice: Choice, outcome: outcomes.Outcome) -> None:
        """One outcome in its version's stream, which canaries compare (ops/core/outcomes.py)."""
        try:
            await outcomes.record(self.redis, self.settings, choice.model, choice.version, outcome)
        except aioredis.RedisError as exc:
            log.debug("event=outcome_not_recorded model=%s error=%r", choice.served, exc)

    # ---- ending early -----------------------------------------------------------------------------
    # One sequence for every door: the route goes, the request stops everywhere (queued, it never
    # runs; running, it frees its slot), and its key is settled with what it generated so far.

    def cancel(self, rid: str, sink: Sink) -> None:
        """A client's `cancel`: the request stops even when this gateway no longer routes it there."""
        route = self.router.remove(rid, sink)
        if route is None:
            self._spawn(self.stop(rid))
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
        route.sink.send(stream_error(route.client_id, code, message))
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
            resumed_at = await self.redis.get(keys.resumed(route.request_id))
        except aioredis.RedisError:
            resumed_at = None
        # A resume after this connection took the request on means the client is back
        # elsewhere, even if it came back before this connection was seen to close.
        if resumed_at is not None and float(resumed_at) > route.since:
            return
        self._end(route)
        log.info("event=abandoned request_id=%s", route.request_id)

    def _end(self, route: Route) -> None:
        self._spawn(self.stop(route.request_id))
        self.settle(route, None)

    # ---- resuming ---------------------------------------------------------------------------------

    async def resume(self, rid: str, caller: Caller, sink: Sink, after_index: int) -> bool:
        """A client's `resume` of a request (queued by any gateway): followed from its replay log
        after `after_index`. False when it was cancelled (its client did not come back within the
        grace time, or cancelled it): it will not finish."""
        try:
            record = await self.redis.get(keys.request(rid))
            queued = QueuedRequest.model_validate_json(record) if record is not None else None
            known = record is not None or bool(await self.redis.exists(keys.stream(rid)))
            if caller.key is not None and (queued is None or queued.api_key != caller.key.id):
                known = False  # another key's request reads as unknown: its id is no ticket to its answer
            cancelled = known and bool(await self.redis.exists(keys.cancelled(rid)))
            if known and not cancelled:
                await self.redis.set(keys.resumed(rid), str(time.time()), ex=keys.resumed_ttl_s(self.settings))
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
        if not await self.redis.exists(keys.stream(rid), keys.request(rid)):
            return False
        self.intake.follow(Route(rid, client_id, sink, keep_text=True))
        return True

    # ---- out --------------------------------------------------------------------------------------

    async def stop(self, rid: str) -> None:
        """Cancel a request everywhere: queued, it never runs; running, it frees its slot."""
        try:
            await self.redis.set(keys.cancelled(rid), "1", ex=keys.cancelled_ttl_s(self.settings))
            await self.redis.zrem(keys.UNCLAIMED, rid)
            await self.redis.publish(keys.CANCEL_CHANNEL, rid)
        except aioredis.RedisError as exc:
            log.warning("event=cancel_failed request_id=%s error=%r", rid, exc)

    def settle(self, route: Route, reply: ReplyEvent | None) -> None:
        """A route ended (`reply` is its done or error event; None when cancelled or abandoned)."""
        context = route.context
        if isinstance(context, ShadowContext):
            self._shadow_ended(route, reply)
            return
        if not isinstance(context, RequestContext) or context.settled:
            return
        context.settled = True
        if context.shadows:
            self._served_ended(route.request_id, route.text if reply is not None and reply.type == "done" else None)
        if reply is not None and context.choice is not None:
            self._spawn(self._record(context.choice, outcomes.from_timing(reply.timing, reply.usage,
                                                                          error=reply.type != "done")))
        usage = (reply.usage if reply is not None else None) or {}
        if reply is None or reply.type != "done":
            # Stopped early (cancel, client gone, refused): what it generated still counts,
            # as far as this gateway saw it.
            usage = {"prompt_tokens": 0, "completion_tokens": route.next_index}
        if reply is not None and reply.type == "done" and context.cache_query is not None and self.cache is not None \
                and context.store_answer and reply.finish_reason in ("stop", "length"):
            self._spawn(self.cache.insert(context.cache_query, context.cache_vector, route.chunks, reply.finish_reason,
                                          usage.get("prompt_tokens", 0), usage.get("completion_tokens", 0)))
        self._spawn(self._settle_usage(context.key_id, route.request_id, usage, cache_hit=False))

    async def _settle_usage(self, key_id: str | None, rid: str, usage: dict, cache_hit: bool) -> None:
        if key_id is None:
            return
        prompt, completion = int(usage.get("prompt_tokens", 0)), int(usage.get("completion_tokens", 0))
        try:
            await self.limiter.release(key_id, rid)
            # Once per request, whichever gateway sees its end first: a half-open old connection
            # and a resumed one may both receive the same `done`.
            if not await self.redis.set(keys.settled(rid), "1", nx=True, ex=keys.settled_ttl_s(self.settings)):
                return
            await self.key_store.record_usage(key_id, prompt, completion, cache_hit)
            if not cache_hit:  # a cached answer cost no compute: it does not count against tokens per minute
                await self.limiter.charge_tokens(key_id, prompt + completion)
        except aioredis.RedisError as exc:  # the slot expires by itself (KeyLimiter's stale age)
            log.warning("event=usage_not_recorded key=%s request_id=%s error=%r", key_id, rid, exc)

    def _release(self, caller: Caller, rid: str) -> None:
        if caller.key is not None:
            self._spawn(self.release_slot(caller.key.id, rid))

    async def release_slot(self, key_id: str, rid: str) -> None:
        try:
            await self.limiter.release(key_id, rid)
        except aioredis.RedisError as exc:
            log.warning("event=slot_not_released key=%s request_id=%s error=%r", key_id, rid, exc)
