"""The gateway: one process serving every door on one host and port, over one admission path.

Rooms (each a sub-package; tests/test_floors.py keeps their order):
- `delivery/`: every event a client is sent (`events.py`), which waiting client gets a worker's
  event (`router.py`, pure) and the replies read from Redis (`replies.py`);
- `request.py`: the one request type and the rules every door's request passes; beside it
  `tool_calls.py`, `metrics.py` and `background.py` (the one set of background tasks, drained at shutdown);
- `admission/`: the version, limits, guards, cache, load, enqueue (`admission.py`), a request's
  life after that (`lifecycle.py`), the caller's API key (`auth.py`), the models (`catalog.py`);
- `doors/`, thin adapters, each reading its own wire format: `ws_door.py` with `ws_protocol.py`
  (/v1/ws), `openai_door.py` with `openai_schema.py` and `openai_render.py` (OpenAI HTTP and SSE),
  `responses_door.py` with `responses_schema.py`, `responses_render.py` and `response_store.py` (/v1/responses),
  `embeddings.py` (/v1/embeddings), `rerank_door.py` (/v1/rerank, /v1/score), `held_models.py` (keys
  and limits of the requests answered with the models the gateway holds), `tokenize_door.py`
  (/tokenize, /detokenize, /tokenizer_info),
  `utility_routes.py` (/health, /ping, /version), and the chat page (`static/`, served at /);
- `batch/`: batch jobs (/v1/files, /v1/batches) run line by line through admission;
- this module: the parts built and wired together (each door is handed what it uses; nothing
  imports this module back), health and readiness, start and stop (uvicorn).

The port is bound before anything loads, so a taken port fails at once with a clear message.
"""
from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import TYPE_CHECKING

import redis
import redis.asyncio as aioredis
import uvicorn
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import FileResponse, JSONResponse, Response
from starlette.routing import Mount, Route, WebSocketRoute
from starlette.staticfiles import StaticFiles

from gateway import metrics
from gateway.admission.admission import Admission
from gateway.admission.api_keys import AuthError, KeyStore, bearer_key
from gateway.admission.audits import Audits
from gateway.admission.auth import Authenticator
from gateway.admission.catalog import Catalog
from gateway.admission.content_guards import GuardConfigError, configured
from gateway.admission.lifecycle import RequestLifecycle
from gateway.admission.limits import KeyLimiter
from gateway.admission.load import LoadMonitor
from gateway.admission.request_store import RequestStore
from gateway.admission.routing import PrefixRouter
from gateway.admission.shadows import Shadows
from gateway.admission.worker_prefixes import PrefixFollower, WorkerPrefixes
from gateway.background import BackgroundTasks
from gateway.batch.door import BatchDoor
from gateway.batch.jobs import JobStore
from gateway.batch.lines import IdenticalLines, LineRunner
from gateway.batch.runner import BatchRunner
from gateway.batch.sweep import FileSweep
from gateway.delivery.replies import ReplyIntake
from gateway.delivery.router import ReplyRouter
from gateway.doors.embeddings import EmbeddingsDoor
from gateway.doors.held_models import HeldModelAdmission
from gateway.doors.openai_door import OpenAIDoor
from gateway.doors.rerank_door import RerankDoor
from gateway.doors.response_store import ResponseStore
from gateway.doors.responses_door import ResponsesDoor
from gateway.doors.tokenize_door import TokenizeDoor
from gateway.doors.utility_routes import UtilityRoutes
from gateway.doors.ws_door import WebSocketDoor
from gateway.doors.ws_protocol import ClientProtocol
from gateway.request import ProtocolError, RequestRules
from ops.core import redis_clients, redis_keys, roster
from ops.rollout.canary import Controller
from ops.core.ports import bind_error
from ops.core.queue import QueueSender
from ops.core.redis_clients import async_client
from ops.core.sampling_defaults import GenerationConfigError, describe, load_sampling_defaults
from ops.core.settings import Settings

if TYPE_CHECKING:
    from cache.answer_cache import AnswerCache

log = logging.getLogger("brigade.gateway")

WS_PATH = "/v1/ws"
STATIC = Path(__file__).resolve().parent / "static"
PATHS = ["/", WS_PATH, "/v1/chat/completions", "/v1/completions", "/v1/responses", "/v1/models", "/v1/embeddings",
         "/v1/rerank", "/rerank", "/v2/rerank", "/v1/score", "/score", "/v1/files", "/v1/batches", "/tokenize",
         "/detokenize", "/tokenizer_info", "/health", "/ping", "/version", "/healthz", "/readyz", "/metrics"]


class Gateway:
    def __init__(self, settings: Settings):
        self.settings = settings
        self.id = uuid.uuid4().hex[:12]
        self.started_at = int(time.time())
        self.stopping = False  # set when the gateway itself shuts down (not a client leaving)
        reply_channel = redis_keys.reply_channel(self.id)
        # Commands time out instead of hanging a request (or /readyz) on a stuck Redis.
        self.redis = async_client(settings.redis_url)
        # Read once at start: the exact-cache key and a sampled request's seed need the values
        # that will run, so the gateway fills unset fields itself (ops/core/sampling_defaults.py).
        defaults = load_sampling_defaults(settings)
        log.info("event=sampling_defaults %s", describe(defaults))
        # The models and versions requests may ask for, and the routes between versions.
        self.catalog = Catalog(self.redis, settings, defaults, self.started_at)
        # Every door's request passes the same rules; the WebSocket door reads its frames into them.
        self.rules = RequestRules(settings, self.catalog)
        self.background = BackgroundTasks()
        spawn = self.background.spawn
        self.router = ReplyRouter()
        # Which worker holds which prefix blocks, and the routing that reads it (docs/scaling.md).
        prefixes = WorkerPrefixes()
        self.prefix_follower = PrefixFollower(self.redis, prefixes)
        self.routing = PrefixRouter(settings, self.catalog, prefixes,
                                    running=lambda rid: self.router.get(rid) is not None)
        self.load = LoadMonitor(self.redis, settings, on_statuses=self._observe_workers)
        self.key_store = KeyStore(self.redis)
        self.auth = Authenticator(settings, self.key_store)
        store = RequestStore(settings, self.redis, QueueSender(settings))
        # The delivery rule is the lifecycle's (RequestLifecycle.deliver); the lifecycle is made after
        # the intake it settles through, so the intake reaches it late.
        self.intake = ReplyIntake(settings, self.router, self.redis, reply_channel,
                                  lambda delivery: self.lifecycle.deliver(delivery), spawn, resend=store.put)
        limiter, guards = KeyLimiter(self.redis), configured(settings)
        shadows = Shadows(settings, self.router, store, spawn)
        self.audits = Audits(settings, self.router, store, spawn)
        self.lifecycle = RequestLifecycle(settings, self.redis, self.router, self.intake, store, shadows,
                                          self.key_store, limiter, guards, spawn, audits=self.audits)
        self.admission = Admission(settings, self.redis, self.router, self.load, limiter, guards, reply_channel, spawn,
                                   self.lifecycle.deliver, store=store, shadows=shadows, audits=self.audits,
                                   lifecycle=self.lifecycle, catalog=self.catalog, routing=self.routing)
        frames = ClientProtocol(settings, self.rules)
        self.ws_door = WebSocketDoor(settings, frames, self.auth, self.admission, self.lifecycle,
                                     lambda: self.stopping)
        self.openai_door = OpenAIDoor(settings, self.rules, self.auth, self.admission, self.lifecycle, self.catalog)
        self.responses_door = ResponsesDoor(settings, self.rules, self.auth, self.admission, self.lifecycle,
                                            ResponseStore(self.redis, settings), spawn)
        # Batch jobs: their records, shared by the door that starts and shows them and the runner
        # that runs whichever this gateway holds the lease of.
        jobs = JobStore(self.redis, settings)
        lines = LineRunner(self.admission, self.lifecycle, self.router, jobs, IdenticalLines())
        self.batches = BatchRunner(settings, jobs, self.rules, lines, self.load, self.key_store, self.id)
        self.batch_door = BatchDoor(settings, self.auth, jobs)
        self.batch_files = FileSweep(jobs)
        self.utility = UtilityRoutes(self.readiness)
        self.tokenize_door = TokenizeDoor(settings, self.rules, self.auth, self.catalog)
        # Answered by the cache's models, here: embeddings, rerank and score, listed in /v1/models.
        held = HeldModelAdmission(settings, limiter, self.lifecycle, spawn)
        self.embeddings_door = EmbeddingsDoor(settings, self.auth, held)
        self.rerank_door = RerankDoor(settings, self.auth, held)
        self.catalog.list_beside(self.embeddings_door.card, self.rerank_door.card)

    # ---- health ------------------------------------------------------------------------------------

    async def healthz(self, request: Request) -> JSONResponse:
        return JSONResponse({"status": "alive", "gateway": self.id})

    async def readyz(self, request: Request) -> JSONResponse:
        report = await self.readiness()
        return JSONResponse(report, status_code=200 if report["ready"] else 503)

    async def readiness(self) -> dict:
        try:
            await self.redis.ping()
            workers = await roster.live_workers_async(self.redis)
        except aioredis.RedisError as exc:
            return {"ready": False, "redis": False, "workers": 0, "reason": f"redis unreachable: {exc}"}
        ready = bool(workers)
        # The registry revision this gateway routes by: an operator (or a test) sees a route change arrive.
        report = {"ready": ready, "redis": True, "workers": len(workers), "registry_revision": self.catalog.revision}
        if not ready:
            report["reason"] = "no worker is alive"
        return report

    async def prometheus(self, request: Request) -> Response:
        if self.settings.metrics_auth == "required":
            try:
                if self.settings.auth_required:
                    await self.auth.authenticate(request.headers.get("authorization"))
                else:
                    await self.key_store.authenticate(bearer_key(request.headers.get("authorization")))
            except (ProtocolError, AuthError) as err:
                return JSONResponse({"error": {"message": err.message, "type": "authentication_error",
                                               "param": None, "code": "unauthorized"}}, status_code=401)
        body, content_type = metrics.exposition()
        return Response(body, media_type=content_type)

    async def page(self, request: Request) -> FileResponse:
        # Revalidated on every load, so a new version of the page is never served stale.
        return FileResponse(STATIC / "index.html", headers={"Cache-Control": "no-cache"})

    # ---- lifecycle ---------------------------------------------------------------------------------

    @contextlib.asynccontextmanager
    async def lifespan(self, app):
        if self.settings.cache_enabled:
            cache = await asyncio.to_thread(self._load_cache)
            self.background.adopt(await cache.start())
        try:
            await self.catalog.refresh()
        except aioredis.RedisError as exc:  # the poll below loads it once Redis answers
            log.warning("event=registry_not_loaded error=%r", exc)
        # The routing's tokenizer loads beside the start, not before it: a restarted gateway must
        # listen as soon as it did (the first routed requests await the same load).
        preload = asyncio.ensure_future(self.routing.preload())
        tasks = [asyncio.create_task(self.intake.listen(), name="reply-router"),
                 asyncio.create_task(self.catalog.run(), name="registry"),

                 asyncio.create_task(self.intake.follow_streams(), name="stream-follower"),
                 asyncio.create_task(self.load.run(), name="load-monitor"),
                 asyncio.create_task(self.prefix_follower.run(), name="prefix-index"),
                 asyncio.create_task(self.batches.run(), name="batch-runner"),
                 asyncio.create_task(self.batch_files.run(), name="batch-sweep")]
        canaries_stop = threading.Event()
        canaries = threading.Thread(target=self.step_canaries, args=(canaries_stop,), name="brigade-canaries",
                                    daemon=True)
        canaries.start()
        await self.intake.subscribed.wait()
        log.info("event=gateway_listening url=%s http=%s gateway=%s auth=%s", self.settings.ws_url,
                 self.settings.http_url, self.id, "required" if self.settings.auth_required else "off")
        try:
            yield
        finally:
            # WebSocket requests run on after a stop, for a resume elsewhere (whose gateway counts
            # their usage); their keys' concurrency slots are freed here.
            for route in self.router.routes():
                key_id = getattr(route.context, "key_id", None)
                if key_id is not None:
                    self.background.spawn(self.lifecycle.release_slot(key_id, route.request_id))
            # Cancels and releases just spawned (HTTP clients cut at the grace) get a moment to land.
            await self.background.drain(timeout_s=2)
            for task in tasks:
                task.cancel()
            canaries_stop.set()
            await asyncio.to_thread(canaries.join, 2)
            # A job this gateway ran is left where its record says; its lease lapses and another
            # gateway (or this one, restarted) continues it.
            await self.batches.close()

    def step_canaries(self, stop: threading.Event) -> None:
        """Try for the canary lease each tick; while this gateway holds it, step every canary. On a
        thread of its own with its own client: a tick that waits out a Redis outage (the client's
        retries) must hold neither the event loop nor a thread of the pool the doors' sends use."""
        controller = Controller(redis_clients.client(self.settings.redis_url), f"gateway:{self.id}", self.settings)
        while not stop.wait(self.settings.canary_tick_s):
            try:
                for decision in controller.tick():
                    metrics.CANARY_DECISIONS.labels(decision.model, decision.version, decision.kind).inc()
            except redis.RedisError as exc:  # Redis away: the next tick tries again
                log.debug("event=canary_tick_failed error=%r", exc)
            except Exception:  # a bad record: said once per tick, and the next tick tries again
                log.exception("event=canary_tick_failed")
        with contextlib.suppress(Exception):
            controller.release()

    def _observe_workers(self, statuses: list[dict]) -> None:
        """Each second's heartbeats: the catalog's live versions, and the routing's loads."""
        self.catalog.observe_workers(statuses)
        self.routing.observe(statuses)

    def _load_cache(self) -> "AnswerCache":
        # Imported here: the cache brings the embedding model (and torch) into the gateway.
        from cache.answer_cache import AnswerCache
        from cache.query import PromptRenderer

        renderer = PromptRenderer(self.settings.model_dir)
        cache = AnswerCache(self.settings, spawn=self.background.spawn)
        self.admission.cache_step.use_cache(cache, renderer)
        self.lifecycle.use_cache(cache)
        self.audits.use_cache(cache)
        self.embeddings_door.use_embedder(cache.embedder)
        self.rerank_door.use_models(cache.embedder, cache.pair_model)
        return cache

    def app(self) -> Starlette:
        http = self.openai_door
        routes = [
            Route("/", self.page),
            Mount("/static", StaticFiles(directory=STATIC), name="static"),
            WebSocketRoute(WS_PATH, self.ws_door.serve),
            Route("/v1/chat/completions", http.chat_completions, methods=["POST"]),
            Route("/v1/completions", http.completions, methods=["POST"]),
            Route("/v1/responses", self.responses_door.create, methods=["POST"]),
            Route("/v1/responses/{response_id}", self.responses_door.retrieve, methods=["GET"]),
            Route("/v1/responses/{response_id}", self.responses_door.delete, methods=["DELETE"]),
            Route("/v1/responses/{response_id}/cancel", self.responses_door.cancel, methods=["POST"]),
            Route("/v1/models", http.models),
            Route("/v1/embeddings", self.embeddings_door.embeddings, methods=["POST"]),
            *[Route(p, self.rerank_door.rerank, methods=["POST"]) for p in ("/v1/rerank", "/rerank", "/v2/rerank")],
            *[Route(p, self.rerank_door.score, methods=["POST"]) for p in ("/v1/score", "/score")],
            Route("/tokenize", self.tokenize_door.tokenize, methods=["POST"]),
            Route("/detokenize", self.tokenize_door.detokenize, methods=["POST"]),
            Route("/tokenizer_info", self.tokenize_door.tokenizer_info),
            Route("/v1/files", self.batch_door.upload_file, methods=["POST"]),
            Route("/v1/files/{file_id}", self.batch_door.file),
            Route("/v1/files/{file_id}/content", self.batch_door.file_content),
            Route("/v1/batches", self.batch_door.create_batch, methods=["POST"]),
            Route("/v1/batches", self.batch_door.list_batches, methods=["GET"]),
            Route("/v1/batches/{batch_id}", self.batch_door.batch),
            Route("/v1/batches/{batch_id}/cancel", self.batch_door.cancel_batch, methods=["POST"]),
            Route("/health", self.utility.health),
            Route("/ping", self.utility.health, methods=["GET", "POST"]),
            Route("/version", self.utility.version),
            Route("/healthz", self.healthz),
            Route("/readyz", self.readyz),
            Route("/metrics", self.prometheus),
        ]
        return Starlette(routes=routes, lifespan=self.lifespan, exception_handlers={HTTPException: _http_error})


async def _http_error(request: Request, exc: HTTPException) -> JSONResponse:
    code = "not_found" if exc.status_code == 404 else "method_not_allowed" if exc.status_code == 405 else "http_error"
    body = {"error": {"message": f"{request.method} {request.url.path}: {exc.detail}", "type": "invalid_request_error",
                      "param": None, "code": code}, "paths": PATHS}
    return JSONResponse(body, status_code=exc.status_code, headers=getattr(exc, "headers", None))


class GatewayServer(uvicorn.Server):
    """uvicorn, told first when the gateway itself stops: WebSocket clients then get a close frame
    (1012, service restart) and their requests run on for a `resume` on another gateway."""

    def __init__(self, config: uvicorn.Config, gateway: Gateway):
        super().__init__(config)
        self.gateway = gateway

    async def shutdown(self, sockets=None) -> None:
        self.gateway.stopping = True
        log.info("event=gateway_stopping routes=%d", len(self.gateway.router.routes()))
        await super().shutdown(sockets)


def bind(host: str, port: int) -> socket.socket:
    """Bind (without listening: nothing is accepted until the gateway is ready) or exit clearly."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    # IPPROTO_TCP named, not left 0: asyncio sets TCP_NODELAY only on sockets that say TCP, and
    # without it Nagle holds each streamed piece until the client's delayed ACK (~40 ms).
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise SystemExit(f"brigade gateway: {bind_error(host, port, exc)}") from None
    return sock


async def run_gateway(settings: Settings) -> None:
    sock = bind(settings.gateway_host, settings.gateway_port)
    try:
        gateway = Gateway(settings)
    except (GuardConfigError, GenerationConfigError) as exc:
        raise SystemExit(f"brigade gateway: {exc}") from None
    config = uvicorn.Config(
        gateway.app(), ws="websockets-sansio", ws_max_size=settings.max_message_bytes,
        ws_ping_interval=settings.ws_ping_interval_s, ws_ping_timeout=settings.ws_ping_timeout_s,
        timeout_graceful_shutdown=settings.gateway_shutdown_grace_s, lifespan="on", log_config=None,
        access_log=False, log_level="warning", server_header=False,
    )
    server = GatewayServer(config, gateway)
    await server.serve(sockets=[sock])
    if not server.started:
        sys.exit(1)
