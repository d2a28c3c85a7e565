"""The WebSocket gateway: validates requests, enqueues them, and routes token events back.

Per connection: a reader (frames -> commands) and a writer draining an outbox, so that one slow
client never stalls the shared reply router. The router is one subscription to this gateway's
reply channel; it forwards each event to the connection that owns the request, dropping events
of an older claim epoch and any index it has already forwarded. After a lost subscription it
catches up from each request's replay log before listening again, so nothing falls in the gap.

A client that reconnects sends `resume`; its requests are then followed through the replay log
(XREAD) rather than pub/sub, which works on any gateway, whoever enqueued them.
"""
from __future__ import annotations

import asyncio
import http
import json
import logging
import secrets
import time
import uuid
from collections import OrderedDict
from dataclasses import dataclass, field

import numpy as np
import redis.asyncio as aioredis
from websockets.asyncio.server import ServerConnection, serve
from websockets.datastructures import Headers
from websockets.exceptions import ConnectionClosed
from websockets.http11 import Request, Response

from cache.query import CacheQuery, make_query
from gateway.load import LoadMonitor
from gateway.protocol import (
    Cancel, ClientProtocol, Feedback, Generate, ProtocolError, Resume, cached_events, done_event, token_event,
)
from ops import keys
from ops.messages import QueuedRequest, ReplyEvent
from ops.redis_pool import shared_client
from ops.settings import Settings
from workers.app import enqueue

log = logging.getLogger("brigade.gateway")

WS_PATH = "/v1/ws"
LOST_WITH_REDIS = "the request was lost while Redis was unavailable; resend it"
OUTBOX_LIMIT = 10_000  # events waiting for one slow client before it is disconnected
SERVED_FROM_CACHE_KEPT = 256  # cached answers per connection that `feedback` can still name


@dataclass
class Route:
    session: "ClientSession"
    client_id: str
    next_index: int = 0
    epoch: int = 0  # the newest claim epoch seen; older events are stale
    since: float = field(default_factory=time.time)  # when this connection took the request on
    stream_id: str = "0-0"  # followed routes: the last replay-log entry read
    # Set when the answer may be stored in the cache once done.
    cache_query: CacheQuery | None = None
    cache_vector: np.ndarray | None = None
    chunks: list[str] = field(default_factory=list)


@dataclass
class ClientSession:
    ws: ServerConnection
    outbox: asyncio.Queue = field(default_factory=lambda: asyncio.Queue(OUTBOX_LIMIT))
    active: dict[str, str] = field(default_factory=dict)  # client id -> server request id
    # Recent cached answers: client id -> (entry id, the question asked), for `feedback`.
    served_from_cache: OrderedDict = field(default_factory=OrderedDict)

    def remember_cached(self, client_id: str, entry_id: str, asked: str) -> None:
        self.served_from_cache[client_id] = (entry_id, asked)
        self.served_from_cache.move_to_end(client_id)
        while len(self.served_from_cache) > SERVED_FROM_CACHE_KEPT:
            self.served_from_cache.popitem(last=False)

    def send(self, event: dict) -> None:
        try:
            self.outbox.put_nowait(event)
        except asyncio.QueueFull:
            # The client reads slower than its own answers arrive; it alone pays for that.
            log.warning("event=slow_client_disconnected active=%d", len(self.active))
            asyncio.ensure_future(self.ws.close(1008, "client too slow"))

    async def write_forever(self) -> None:
        while True:
            event = await self.outbox.get()
            await self.ws.send(json.dumps(event))


class Gateway:
    def __init__(self, settings: Settings):
        self.settings = settings
        self.id = uuid.uuid4().hex[:12]
        self.reply_channel = keys.reply_channel(self.id)
        # Commands time out instead of hanging a request (or /readyz) on a stuck Redis; the
        # subscriber has no read timeout (it idles between events) but checks its connection.
        self.redis = shared_client(settings.redis_url, socket_timeout=5, socket_connect_timeout=2)
        self.subscriber = aioredis.Redis.from_url(settings.redis_url, socket_connect_timeout=2, health_check_interval=30)
        self.protocol = ClientProtocol(settings)
        self.routes: dict[str, Route] = {}  # live through pub/sub
        self.followed: dict[str, Route] = {}  # resumed: read from the replay log
        self._follow_changed = asyncio.Event()
        # XREAD blocks for a while: this connection's read timeout must outlast the block.
        self.follower = aioredis.Redis.from_url(settings.redis_url, socket_timeout=10, socket_connect_timeout=2)
        self.load = LoadMonitor(self.redis, settings)
        self.subscribed = asyncio.Event()
        self.cache = None
        self.renderer = None
        self._background: set[asyncio.Task] = set()

    def _load_cache(self) -> None:
        # Imported here: the cache brings the embedding model (and torch) into the gateway.
        from cache.answer_cache import AnswerCache
        from cache.query import PromptRenderer

        self.renderer = PromptRenderer(self.settings.model_dir)
        self.cache = AnswerCache(self.settings)

    # ---- lifecycle -------------------------------------------------------------------------------

    async def serve_forever(self, ready: asyncio.Event | None = None) -> None:
        if self.settings.cache_enabled:
            await asyncio.to_thread(self._load_cache)
            self._background.update(await self.cache.start())
        router = asyncio.create_task(self._route_replies(), name="reply-router")
        self._background.add(asyncio.create_task(self._follow_streams(), name="stream-follower"))
        self._background.add(asyncio.create_task(self.load.run(), name="load-monitor"))
        await self.subscribed.wait()
        async with serve(
            self._handle,
            self.settings.gateway_host,
            self.settings.gateway_port,
            process_request=self._http,
            max_size=self.settings.max_message_bytes,
        ) as server:
            log.info("event=gateway_listening url=%s gateway=%s", self.settings.ws_url, self.id)
            if ready is not None:
                ready.set()
            try:
                await server.serve_forever()
            finally:
                router.cancel()

    # ---- HTTP: health and readiness ---------------------------------------------------------------

    async def _http(self, connection: ServerConnection, request: Request) -> Response | None:
        path = request.path.split("?", 1)[0]
        if path == WS_PATH:
            return None
        if path == "/healthz":
            return _json_response(http.HTTPStatus.OK, {"status": "alive", "gateway": self.id})
        if path == "/readyz":
            report = await self.readiness()
            status = http.HTTPStatus.OK if report["ready"] else http.HTTPStatus.SERVICE_UNAVAILABLE
            return _json_response(status, report)
        return _json_response(http.HTTPStatus.NOT_FOUND, {"error": "not_found", "paths": [WS_PATH, "/healthz", "/readyz"]})

    async def readiness(self) -> dict:
        try:
            await self.redis.ping()
            workers = [k async for k in self.redis.scan_iter(match=keys.WORKER_PATTERN, count=100)]
        except aioredis.RedisError as exc:
            return {"ready": False, "redis": False, "workers": 0, "reason": f"redis unreachable: {exc}"}
        ready = bool(workers)
        report = {"ready": ready, "redis": True, "workers": len(workers)}
        if not ready:
            report["reason"] = "no worker is alive"
        return report

    # ---- WebSocket connections -----------------------------------------------------------------------

    async def _handle(self, ws: ServerConnection) -> None:
        session = ClientSession(ws)
        writer = asyncio.create_task(session.write_forever())
        try:
            async for frame in ws:
                await self._on_frame(session, frame)
        except ConnectionClosed:
            pass
        finally:
            # A client that leaves may come back with `resume` (to any gateway) within the grace
            # time; after it, its requests stop: queued ones never run, running ones free their slot.
            for client_id, rid in list(session.active.items()):
                route = self._route_of(rid, session)
                self._forget(rid, session)
                # A resume after this connection took the request on means the client is back
                # elsewhere, even if it came back before this connection was seen to close.
                since = route.since if route is not None else time.time()
                self._spawn(self._cancel_unless_resumed(rid, since))
            writer.cancel()

    async def _on_frame(self, session: ClientSession, frame: str | bytes) -> None:
        try:
            command = self.protocol.parse(frame)
            if isinstance(command, Generate):
                await self._generate(session, command)
            elif isinstance(command, Cancel):
                if command.id not in session.active:
                    raise ProtocolError("unknown_id", f"no request {command.id!r} is running on this connection", command.id, "id")
                await self._cancel(session, command.id, notify=True)
            elif isinstance(command, Resume):
                await self._resume(session, command)
            elif isinstance(command, Feedback):
                await self._feedback(session, command)
        except ProtocolError as err:
            session.send(err.event())
        except Exception:  # a bug must cost this one message, not the connection and its other requests
            log.exception("event=frame_failed")
            session.send({"type": "error", "code": "internal_error", "message": "the gateway failed on this message"})

    async def _generate(self, session: ClientSession, cmd: Generate) -> None:
        if cmd.id in session.active:
            # No `id` on this error: an error carrying an id ends that request, and this one runs on.
            raise ProtocolError("duplicate_id", f"request {cmd.id!r} is already running on this connection", None, "id")
        if len(session.active) >= self.settings.max_requests_per_connection:
            raise ProtocolError(
                "too_many_requests",
                f"at most {self.settings.max_requests_per_connection} requests at once per connection",
                cmd.id,
            )
        started = time.perf_counter()
        query, vector = None, None
        if self.cache is not None and cmd.cache != "off":
            query = self._cache_query(cmd)
            if query is not None:
                lookup = await self.cache.lookup(query)
                if lookup.hit is not None:
                    self._send_hit(session, cmd.id, lookup.hit, time.perf_counter() - started)
                    session.remember_cached(cmd.id, lookup.hit.entry.entry_id, query.question)
                    return
                vector = lookup.vector
        await self._refuse_if_overloaded(cmd)
        params = cmd.params
        if params.temperature > 0 and params.seed is None:
            # Drawn here, once: a worker that continues this request after a crash samples the
            # same random stream, so the answer is the one an uninterrupted run would give.
            params = params.model_copy(update={"seed": secrets.randbits(63)})
        rid = uuid.uuid4().hex
        now = time.time()
        queued = QueuedRequest(
            request_id=rid,
            client_id=cmd.id,
            reply_channel=self.reply_channel,
            enqueued_at=now,
            model=cmd.model,
            prompt=cmd.prompt,
            messages=cmd.messages,
            params=params,
            deadline_at=now + cmd.deadline_ms / 1000 if cmd.deadline_ms else None,
        )
        # Route first: a fast worker's first token must find its way back.
        self.routes[rid] = Route(session, cmd.id, cache_query=query, cache_vector=vector)
        session.active[cmd.id] = rid
        payload = queued.model_dump(mode="json")
        try:
            pipe = self.redis.pipeline(transaction=False)
            pipe.set(keys.request(rid), json.dumps(payload), ex=self.settings.stream_ttl_s)
            pipe.zadd(keys.UNCLAIMED, {rid: queued.enqueued_at})
            await pipe.execute()
            await asyncio.to_thread(enqueue, queued, True)
        except Exception as exc:  # Redis or broker down: this request fails, the connection lives
            self._forget(rid)
            log.warning("event=enqueue_failed request_id=%s error=%r", rid, exc)
            self._spawn(self._stop_request(rid))  # the client was told it failed: it must not run later
            raise ProtocolError("unavailable", "the request could not be queued; try again shortly", cmd.id) from None
        log.info("event=enqueued request_id=%s client_id=%s", rid, cmd.id)
        session.send({"type": "queued", "id": cmd.id, "request_id": rid})

    async def _refuse_if_overloaded(self, cmd: Generate) -> None:
        try:
            pipe = self.redis.pipeline(transaction=False)
            for name in keys.queue_lists(cmd.model):
                pipe.llen(name)
            depth = sum(await pipe.execute())
        except aioredis.RedisError:
            return  # the enqueue just after says `unavailable`
        limit = self.settings.max_queue_depth
        if depth >= limit:
            raise ProtocolError("overloaded", f"{depth} requests are waiting (the limit is {limit}); try again shortly",
                                cmd.id)
        if cmd.deadline_ms is not None:
            wait = self.load.estimated_wait_s(depth)
            if wait is not None and wait * 1000 > cmd.deadline_ms:
                raise ProtocolError(
                    "overloaded", f"the estimated wait ({wait:.1f} s) is longer than the deadline "
                    f"({cmd.deadline_ms} ms); try again shortly or allow more time", cmd.id)

    async def _resume(self, session: ClientSession, cmd: Resume) -> None:
        rid = cmd.id
        if rid in session.active:
            raise ProtocolError("duplicate_id", f"request {rid!r} is already followed on this connection", None, "id")
        try:
            known = await self.redis.exists(keys.stream(rid), keys.request(rid))
            cancelled = await self.redis.exists(keys.cancelled(rid))
            if known and not cancelled:
                await self.redis.set(keys.resumed(rid), str(time.time()), ex=self.settings.stream_ttl_s)
        except aioredis.RedisError:
            raise ProtocolError("unavailable", "the replay log cannot be read now; try again shortly", rid) from None
        if not known:
            raise ProtocolError("unknown_request", f"no request {rid!r} is known (or its replay log expired)", rid, "id")
        if cancelled:
            # Its client did not come back within the grace time (or cancelled it): it will not finish.
            session.send(done_event(rid, "cancelled", None, None))
            return
        self.followed[rid] = Route(session, rid, next_index=cmd.after_index + 1)
        session.active[rid] = rid
        self._follow_changed.set()
        log.info("event=resumed request_id=%s after_index=%d", rid, cmd.after_index)

    def _route_of(self, rid: str, session: ClientSession) -> Route | None:
        for table in (self.routes, self.followed):
            route = table.get(rid)
            if route is not None and route.session is session:
                return route
        return None

    async def _cancel_unless_resumed(self, rid: str, since: float) -> None:
        await asyncio.sleep(self.settings.resume_grace_s)
        try:
            resumed_at = await self.redis.get(keys.resumed(rid))
        except aioredis.RedisError:
            resumed_at = None
        if resumed_at is not None and float(resumed_at) > since:
            return
        await self._stop_request(rid)
        log.info("event=abandoned request_id=%s", rid)

    def _cache_query(self, cmd: Generate) -> CacheQuery | None:
        try:
            return make_query(self.renderer, cmd.model, cmd.prompt, cmd.messages, cmd.params, cmd.cache,
                              cmd.cache_threshold)
        except Exception as exc:  # a template that cannot render this input: no caching, no failure
            log.warning("event=cache_query_failed client_id=%s error=%r", cmd.id, exc)
            return None

    def _send_hit(self, session: ClientSession, client_id: str, hit, elapsed: float) -> None:
        entry = hit.entry
        usage = {"prompt_tokens": entry.prompt_tokens, "completion_tokens": entry.completion_tokens}
        for event in cached_events(client_id, entry.chunks, entry.finish_reason, usage, hit.layer, hit.similarity,
                                   elapsed, entry.entry_id):
            session.send(event)
        log.info("event=cache_hit client_id=%s layer=%s similarity=%.4f entry=%s", client_id, hit.layer,
                 hit.similarity, entry.entry_id)

    async def _feedback(self, session: ClientSession, cmd: Feedback) -> None:
        served = session.served_from_cache.pop(cmd.id, None)
        if served is None or self.cache is None:
            raise ProtocolError("unknown_request", f"no cached answer to {cmd.id!r} on this connection "
                                "(feedback names the id of a request answered from the cache)", cmd.id, "id")
        entry_id, asked = served
        try:
            evicted = await self.cache.forget(entry_id, asked)
        except Exception as exc:  # Redis down: say so; the client may send it again
            session.served_from_cache[cmd.id] = served
            log.warning("event=cache_feedback_failed client_id=%s entry=%s error=%r", cmd.id, entry_id, exc)
            raise ProtocolError("unavailable", "the feedback could not be recorded; try again shortly", cmd.id) from None
        log.info("event=cache_feedback client_id=%s entry=%s verdict=%s evicted=%s", cmd.id, entry_id, cmd.verdict,
                 evicted)
        session.send({"type": "feedback_recorded", "id": cmd.id, "entry": entry_id, "evicted": evicted})

    def _store_answer(self, route: Route, event: ReplyEvent) -> None:
        usage = event.usage or {}
        self._spawn(self.cache.insert(
            route.cache_query, route.cache_vector, route.chunks, event.finish_reason,
            usage.get("prompt_tokens", 0), usage.get("completion_tokens", 0),
        ))

    async def _cancel(self, session: ClientSession, client_id: str, notify: bool) -> None:
        rid = session.active.get(client_id)
        if rid is None:
            return
        self._forget(rid, session)
        await self._stop_request(rid)
        log.info("event=cancelled request_id=%s client_id=%s notify=%s", rid, client_id, notify)
        if notify:
            session.send(done_event(client_id, "cancelled", None, None))

    async def _stop_request(self, rid: str) -> None:
        try:
            await self.redis.set(keys.cancelled(rid), "1", ex=self.settings.cancel_ttl_s)
            await self.redis.zrem(keys.UNCLAIMED, rid)
            await self.redis.publish(keys.CANCEL_CHANNEL, rid)
        except aioredis.RedisError as exc:
            log.warning("event=cancel_failed request_id=%s error=%r", rid, exc)

    def _forget(self, rid: str, session: ClientSession | None = None) -> None:
        """Stop routing a request (to `session` only, when given: another connection may follow it too)."""
        for table in (self.routes, self.followed):
            route = table.get(rid)
            if route is not None and (session is None or route.session is session):
                del table[rid]
                route.session.active.pop(route.client_id, None)

    # ---- events from workers ----------------------------------------------------------------------------

    async def _route_replies(self) -> None:
        delay, down_since, first = 0.25, None, True
        while True:
            try:
                pubsub = self.subscriber.pubsub(ignore_subscribe_messages=True)
                await pubsub.subscribe(self.reply_channel)
                if not first:
                    # Pub/sub lost whatever was published while we were away; the replay logs did not.
                    await self._catch_up(list(self.routes))
                    log.info("event=reply_router_reconnected routes=%d", len(self.routes))
                first, delay, down_since = False, 0.25, None
                self.subscribed.set()
                async for message in pubsub.listen():
                    if message.get("type") != "message":
                        continue
                    try:
                        event = ReplyEvent.model_validate_json(message["data"])
                    except ValueError:
                        log.error("event=bad_reply_event data=%r", message["data"][:200])
                        continue
                    route = self.routes.get(event.request_id)
                    if route is None:
                        continue  # cancelled, or its client left
                    if event.type == "token" and event.index is not None and event.index > route.next_index:
                        # A gap: something was missed. The replay log has it, in order.
                        self._spawn(self._catch_up([event.request_id]))
                        continue
                    self._forward(self.routes, route, event)
            except Exception as exc:  # Redis, or anything else: the router must outlive it
                down_since = down_since or time.monotonic()
                log.warning("event=reply_router_reconnect error=%r retry_s=%.2f", exc, delay)
                if time.monotonic() - down_since > self.settings.redis_outage_grace_s:
                    self._fail_all("unavailable", "the service lost its connection to Redis; resend the request")
                await asyncio.sleep(delay)
                delay = min(delay * 2, 2.0)

    async def _catch_up(self, rids: list[str]) -> None:
        """Forward what each request's replay log holds beyond what its client has; a request
        whose records are gone (Redis lost its data) ends with an error instead of waiting forever."""
        for rid in rids:
            route = self.routes.get(rid)
            if route is None:
                continue
            entries = await self.redis.xrange(keys.stream(rid))
            for _, fields in entries:
                if self.routes.get(rid) is not route:
                    break
                event = _logged_event(fields)
                if event is not None:
                    self._forward(self.routes, route, event)
            if self.routes.get(rid) is route and not entries and not await self.redis.exists(keys.request(rid)):
                self._end_with_error(self.routes, route, rid, "unavailable", LOST_WITH_REDIS)

    def _fail_all(self, code: str, message: str) -> None:
        for table in (self.routes, self.followed):
            for rid, route in list(table.items()):
                self._end_with_error(table, route, rid, code, message)

    def _end_with_error(self, table: dict, route: Route, rid: str, code: str, message: str) -> None:
        self._forward(table, route, ReplyEvent(type="error", request_id=rid, code=code, message=message))

    def _spawn(self, coro) -> None:
        task = asyncio.ensure_future(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def _follow_streams(self) -> None:
        """Resumed requests: read their replay logs from where each client stands, then live."""
        delay = 0.25
        while True:
            if not self.followed:
                self._follow_changed.clear()
                await self._follow_changed.wait()
                continue
            self._follow_changed.clear()
            rid_of = {keys.stream(rid).encode(): rid for rid in self.followed}
            streams = {keys.stream(rid): route.stream_id for rid, route in self.followed.items()}
            try:
                if delay > 0.25:  # back from an error: a log that vanished (Redis lost its data) ends its follow
                    await self._end_vanished_follows()
                replies = await self.follower.xread(streams, count=1000, block=250)
                delay = 0.25
            except (aioredis.RedisError, OSError) as exc:
                log.warning("event=stream_follower_error error=%r retry_s=%.2f", exc, delay)
                await asyncio.sleep(delay)
                delay = min(delay * 2, 2.0)
                continue
            for stream_key, entries in replies or []:
                rid = rid_of[stream_key]
                for entry_id, fields in entries:
                    route = self.followed.get(rid)
                    if route is None:
                        break
                    route.stream_id = entry_id.decode()
                    event = _logged_event(fields)
                    if event is not None:
                        self._forward(self.followed, route, event)

    async def _end_vanished_follows(self) -> None:
        for rid, route in list(self.followed.items()):
            if not await self.follower.exists(keys.stream(rid), keys.request(rid)):
                self._end_with_error(self.followed, route, rid, "unavailable", LOST_WITH_REDIS)

    def _forward(self, table: dict[str, Route], route: Route, event: ReplyEvent) -> None:
        """Send one worker event to its client, unless stale or already sent; ends the route on done/error."""
        if event.epoch is not None:
            if event.epoch < route.epoch:
                return  # from a worker whose claim was taken over
            route.epoch = event.epoch
        if event.type == "token":
            if event.index is None or event.index < route.next_index:
                return  # already forwarded
            route.next_index = event.index + 1
            route.session.send(token_event(route.client_id, event.index, event.text or ""))
            if route.cache_query is not None:
                route.chunks.append(event.text or "")
            return
        if table.get(event.request_id) is route:
            del table[event.request_id]
            route.session.active.pop(route.client_id, None)
        if event.type == "done":
            if route.cache_query is not None and event.finish_reason in ("stop", "length"):
                self._store_answer(route, event)
            route.session.send(done_event(route.client_id, event.finish_reason or "stop", event.usage, event.timing))
        else:
            route.session.send(
                {"type": "error", "id": route.client_id, "code": event.code or "error", "message": event.message or ""}
            )


def _logged_event(fields: dict) -> ReplyEvent | None:
    """One replay-log entry as an event; a malformed entry is logged and skipped, never fatal."""
    try:
        return ReplyEvent.model_validate_json(fields[b"event"])
    except (KeyError, ValueError):
        log.error("event=bad_log_entry fields=%r", str(fields)[:200])
        return None


def _json_response(status: http.HTTPStatus, body: dict) -> Response:
    data = json.dumps(body).encode()
    headers = Headers([("Content-Type", "application/json"), ("Content-Length", str(len(data)))])
    return Response(status.value, status.phrase, headers, data)


async def run_gateway(settings: Settings) -> None:
    await Gateway(settings).serve_forever()
