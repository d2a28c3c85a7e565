"""The WebSocket gateway: validates requests, enqueues them, and routes token events back.

Per connection: a reader (frames -> commands) and a writer draining an outbox, so that one slow
client never stalls the shared reply router. The router is one subscription to this gateway's
reply channel; it forwards each event to the connection that owns the request, dropping any
index it has already forwarded.
"""
from __future__ import annotations

import asyncio
import http
import json
import logging
import time
import uuid
from dataclasses import dataclass, field

import numpy as np
import redis.asyncio as aioredis
from websockets.asyncio.server import ServerConnection, serve
from websockets.datastructures import Headers
from websockets.exceptions import ConnectionClosed
from websockets.http11 import Request, Response

from cache.query import CacheQuery, make_query
from gateway.protocol import Cancel, ClientProtocol, Generate, ProtocolError, cached_events, done_event, token_event
from ops import keys
from ops.messages import QueuedRequest, ReplyEvent
from ops.settings import Settings
from workers.app import GENERATE_TASK, app as celery_app

log = logging.getLogger("brigade.gateway")

WS_PATH = "/v1/ws"
OUTBOX_LIMIT = 10_000  # events waiting for one slow client before it is disconnected


@dataclass
class Route:
    session: "ClientSession"
    client_id: str
    next_index: int = 0
    # Set when the answer may be stored in the cache once done.
    cache_query: CacheQuery | None = None
    cache_vector: np.ndarray | None = None
    chunks: list[str] = field(default_factory=list)


@dataclass
class ClientSession:
    ws: ServerConnection
    outbox: asyncio.Queue = field(default_factory=lambda: asyncio.Queue(OUTBOX_LIMIT))
    active: dict[str, str] = field(default_factory=dict)  # client id -> server request id

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
        self.redis = aioredis.Redis.from_url(settings.redis_url, socket_timeout=5, socket_connect_timeout=2)
        self.subscriber = aioredis.Redis.from_url(settings.redis_url, socket_connect_timeout=2, health_check_interval=30)
        self.protocol = ClientProtocol(settings)
        self.routes: dict[str, Route] = {}
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
            # A client that leaves stops its requests: queued ones never run, running ones free their slot.
            for client_id in list(session.active):
                await self._cancel(session, client_id, notify=False)
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
        except ProtocolError as err:
            session.send(err.event())

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
                    return
                vector = lookup.vector
        rid = uuid.uuid4().hex
        queued = QueuedRequest(
            request_id=rid,
            client_id=cmd.id,
            reply_channel=self.reply_channel,
            enqueued_at=time.time(),
            model=cmd.model,
            prompt=cmd.prompt,
            messages=cmd.messages,
            params=cmd.params,
        )
        # Route first: a fast worker's first token must find its way back.
        self.routes[rid] = Route(session, cmd.id, cache_query=query, cache_vector=vector)
        session.active[cmd.id] = rid
        payload = queued.model_dump(mode="json")
        try:
            await self.redis.set(keys.request(rid), json.dumps(payload), ex=self.settings.stream_ttl_s)
            await asyncio.to_thread(
                celery_app.send_task, GENERATE_TASK, args=[payload], task_id=rid,
                queue=keys.interactive_queue(cmd.model),
            )
        except Exception as exc:  # Redis or broker down: this request fails, the connection lives
            self._forget(rid)
            log.warning("event=enqueue_failed request_id=%s error=%r", rid, exc)
            raise ProtocolError("unavailable", "the request could not be queued; try again shortly", cmd.id) from None
        log.info("event=enqueued request_id=%s client_id=%s", rid, cmd.id)
        session.send({"type": "queued", "id": cmd.id, "request_id": rid})

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
        for event in cached_events(client_id, entry.chunks, entry.finish_reason, usage, hit.layer, hit.similarity, elapsed):
            session.send(event)
        log.info("event=cache_hit client_id=%s layer=%s similarity=%.4f entry=%s", client_id, hit.layer,
                 hit.similarity, entry.entry_id)

    def _store_answer(self, route: Route, event: ReplyEvent) -> None:
        usage = event.usage or {}
        task = asyncio.ensure_future(self.cache.insert(
            route.cache_query, route.cache_vector, route.chunks, event.finish_reason,
            usage.get("prompt_tokens", 0), usage.get("completion_tokens", 0),
        ))
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def _cancel(self, session: ClientSession, client_id: str, notify: bool) -> None:
        rid = session.active.get(client_id)
        if rid is None:
            return
        self._forget(rid)
        try:
            await self.redis.set(keys.cancelled(rid), "1", ex=self.settings.cancel_ttl_s)
            await self.redis.publish(keys.CANCEL_CHANNEL, rid)
        except aioredis.RedisError as exc:
            log.warning("event=cancel_failed request_id=%s error=%r", rid, exc)
        log.info("event=cancelled request_id=%s client_id=%s notify=%s", rid, client_id, notify)
        if notify:
            session.send(done_event(client_id, "cancelled", None, None))

    def _forget(self, rid: str) -> None:
        route = self.routes.pop(rid, None)
        if route is not None:
            route.session.active.pop(route.client_id, None)

    # ---- events from workers ----------------------------------------------------------------------------

    async def _route_replies(self) -> None:
        while True:
            try:
                pubsub = self.subscriber.pubsub(ignore_subscribe_messages=True)
                await pubsub.subscribe(self.reply_channel)
                self.subscribed.set()
                async for message in pubsub.listen():
                    if message.get("type") != "message":
                        continue
                    try:
                        event = ReplyEvent.model_validate_json(message["data"])
                    except ValueError:
                        log.error("event=bad_reply_event data=%r", message["data"][:200])
                        continue
                    self._deliver(event)
            except (aioredis.RedisError, OSError) as exc:
                log.warning("event=reply_router_reconnect error=%r", exc)
                await asyncio.sleep(1.0)

    def _deliver(self, event: ReplyEvent) -> None:
        route = self.routes.get(event.request_id)
        if route is None:
            return  # cancelled, or its client left
        if event.type == "token":
            if event.index is None or event.index < route.next_index:
                return  # already forwarded
            route.next_index = event.index + 1
            route.session.send(token_event(route.client_id, event.index, event.text or ""))
            if route.cache_query is not None:
                route.chunks.append(event.text or "")
        elif event.type == "done":
            self._forget(event.request_id)
            if route.cache_query is not None and event.finish_reason in ("stop", "length"):
                self._store_answer(route, event)
            route.session.send(done_event(route.client_id, event.finish_reason or "stop", event.usage, event.timing))
        else:
            self._forget(event.request_id)
            route.session.send(
                {"type": "error", "id": route.client_id, "code": event.code or "error", "message": event.message or ""}
            )


def _json_response(status: http.HTTPStatus, body: dict) -> Response:
    data = json.dumps(body).encode()
    headers = Headers([("Content-Type", "application/json"), ("Content-Length", str(len(data)))])
    return Response(status.value, status.phrase, headers, data)


async def run_gateway(settings: Settings) -> None:
    await Gateway(settings).serve_forever()
