"""The WebSocket door: Brigade's own streaming protocol at /v1/ws (docs/websocket.md).

Per connection: a reader (frames -> commands) and a writer draining an outbox, so that one slow
client never stalls the shared reply router. A client that leaves may `resume` its requests
(on any gateway) within the grace time; after it, they are cancelled. When the gateway itself
stops, connections get a close frame (1012) and their requests run on, for a resume elsewhere.

Browsers cannot set headers on a WebSocket: besides `Authorization: Bearer KEY`, the key may be
offered as the subprotocol `brigade.bearer.KEY` next to `brigade`, which the gateway selects.
"""
from __future__ import annotations

import asyncio
import json
import logging
from collections import OrderedDict
from typing import Callable

from starlette.websockets import WebSocket, WebSocketDisconnect

from gateway.admission.admission import Admission
from gateway.admission.auth import Authenticator
from gateway.admission.lifecycle import Caller, RequestLifecycle
from gateway.delivery.events import ClientEvent, Done, FeedbackRecorded, Queued, Refused
from gateway.doors.ws_protocol import Cancel, ClientProtocol, Feedback, Resume
from gateway.request import Generate, ProtocolError
from ops.core.settings import Settings

log = logging.getLogger("brigade.gateway")

OUTBOX_LIMIT = 10_000  # events waiting for one slow client before it is disconnected
SERVED_FROM_CACHE_KEPT = 256  # cached answers per connection that `feedback` can still name
SUBPROTOCOL = "brigade"
BEARER_SUBPROTOCOL = "brigade.bearer."


class WebSocketSession:
    """One client connection: the sink of all its requests' events, each rendered as the protocol's
    JSON frame only as it goes out."""

    def __init__(self, ws: WebSocket, caller: Caller):
        self.ws = ws
        self.caller = caller
        self.outbox: asyncio.Queue[ClientEvent] = asyncio.Queue(OUTBOX_LIMIT)
        self.active: dict[str, str] = {}  # client id -> server request id
        # Recent cached answers: client id -> (entry id, the question asked), for `feedback`.
        self.served_from_cache: OrderedDict = OrderedDict()
        self._closing: asyncio.Task | None = None

    def remember_cached(self, client_id: str, hit, asked: str) -> None:
        """`hit`: cache.answer_cache.Hit (its entry, layer and cosine are what feedback learns from)."""
        self.served_from_cache[client_id] = (hit, asked)
        self.served_from_cache.move_to_end(client_id)
        while len(self.served_from_cache) > SERVED_FROM_CACHE_KEPT:
            self.served_from_cache.popitem(last=False)

    def send(self, event: ClientEvent) -> None:
        try:
            self.outbox.put_nowait(event)
        except asyncio.QueueFull:
            # The client reads slower than its own answers arrive; it alone pays for that.
            if self._closing is None:
                log.warning("event=slow_client_disconnected active=%d", len(self.active))
                self._closing = asyncio.ensure_future(self.ws.close(1008, "client too slow"))

    def queued(self, client_id: str, request_id: str) -> None:
        self.active[client_id] = request_id
        self.send(Queued(client_id, request_id))

    def ended(self, client_id: str) -> None:
        self.active.pop(client_id, None)

    async def write_forever(self) -> None:
        while True:
            event = await self.outbox.get()
            await self.ws.send_text(json.dumps(event.wire()))


def offered_key(ws: WebSocket) -> str | None:
    """The API key: an Authorization header, else a `brigade.bearer.KEY` subprotocol."""
    header = ws.headers.get("authorization")
    if header:
        return header
    for proto in ws.scope.get("subprotocols") or []:
        if proto.startswith(BEARER_SUBPROTOCOL):
            return "Bearer " + proto[len(BEARER_SUBPROTOCOL):]
    return None


class WebSocketDoor:
    def __init__(self, settings: Settings, protocol: ClientProtocol, auth: Authenticator, admission: Admission,
                 lifecycle: RequestLifecycle, stopping: Callable[[], bool]):
        self.settings = settings
        self.protocol = protocol
        self.auth = auth
        self.admission = admission
        self.lifecycle = lifecycle
        self.stopping = stopping  # True once the gateway itself shuts down (not a client leaving)

    async def serve(self, ws: WebSocket) -> None:
        offered = ws.scope.get("subprotocols") or []
        await ws.accept(subprotocol=SUBPROTOCOL if SUBPROTOCOL in offered else None)
        try:
            caller = Caller(await self.auth.authenticate(offered_key(ws)), "ws")
        except ProtocolError as err:
            # Accepted first so that a browser, which never sees a refused handshake's status, reads why.
            await ws.send_text(json.dumps(err.event().wire()))
            await ws.close(1008, "unauthorized")
            return
        session = WebSocketSession(ws, caller)
        writer = asyncio.create_task(session.write_forever())
        try:
            while True:
                message = await ws.receive()
                if message["type"] == "websocket.disconnect":
                    break
                frame = message.get("text")
                await self._on_frame(session, frame if frame is not None else message.get("bytes") or b"")
        except WebSocketDisconnect:
            pass
        finally:
            self._left(session)
            writer.cancel()

    def _left(self, session: WebSocketSession) -> None:
        if self.stopping():
            return  # the gateway stops, not the client: its requests run on for a resume elsewhere
        # A client that leaves may come back with `resume` (to any gateway) within the grace time;
        # after it, its requests stop: queued ones never run, running ones free their slot.
        for rid in list(session.active.values()):
            self.lifecycle.hold_for_resume(rid, session)
        session.active.clear()

    async def _on_frame(self, session: WebSocketSession, frame: str | bytes) -> None:
        try:
            command = self.protocol.parse(frame)
            if isinstance(command, Generate):
                await self._generate(session, command)
            elif isinstance(command, Cancel):
                if command.id not in session.active:
                    raise ProtocolError("unknown_id", f"no request {command.id!r} is running on this connection",
                                        command.id, "id")
                self._cancel(session, command.id)
            elif isinstance(command, Resume):
                await self._resume(session, command)
            elif isinstance(command, Feedback):
                await self._feedback(session, command)
        except ProtocolError as err:
            session.send(err.event())
        except Exception:  # a bug must cost this one message, not the connection and its other requests
            log.exception("event=frame_failed")
            session.send(Refused("internal_error", "the gateway failed on this message"))

    async def _generate(self, session: WebSocketSession, cmd: Generate) -> None:
        if cmd.id in session.active:
            # No `id` on this error: an error carrying an id ends that request, and this one runs on.
            raise ProtocolError("duplicate_id", f"request {cmd.id!r} is already running on this connection", None, "id")
        if len(session.active) >= self.settings.max_requests_per_connection:
            raise ProtocolError("too_many_requests",
                                f"at most {self.settings.max_requests_per_connection} requests at once per connection",
                                cmd.id)
        caller = session.caller
        if caller.key is not None:
            try:
                caller = Caller(await self.auth.still_valid(caller.key), "ws")
            except ProtocolError as err:
                err.request_id = cmd.id
                raise
        admitted = await self.admission.admit(cmd, caller, session)
        if admitted.request_id is None:
            for event in admitted.cached:
                session.send(event)
            session.remember_cached(cmd.id, admitted.hit, admitted.asked)

    def _cancel(self, session: WebSocketSession, client_id: str) -> None:
        rid = session.active.pop(client_id, None)
        if rid is None:
            return
        self.lifecycle.cancel(rid, session)
        log.info("event=cancelled request_id=%s client_id=%s", rid, client_id)
        session.send(Done.cancelled(client_id))

    async def _resume(self, session: WebSocketSession, cmd: Resume) -> None:
        rid = cmd.id
        if rid in session.active or rid in session.active.values():
            raise ProtocolError("duplicate_id", f"request {rid!r} is already followed on this connection", None, "id")
        if not await self.lifecycle.resume(rid, session.caller, session, cmd.after_index):
            # Its client did not come back within the grace time (or cancelled it): it will not finish.
            session.send(Done.cancelled(rid))
            return
        # Its replayed events come on a later turn of the loop, and find it active by then.
        session.active[rid] = rid

    async def _feedback(self, session: WebSocketSession, cmd: Feedback) -> None:
        served = session.served_from_cache.pop(cmd.id, None)
        if served is None or not self.admission.cache_step.caching:
            raise ProtocolError("unknown_request", f"no cached answer to {cmd.id!r} on this connection "
                                "(feedback names the id of a request answered from the cache)", cmd.id, "id")
        hit, asked = served
        entry_id = hit.entry.entry_id
        try:
            evicted = await self.admission.cache_step.forget(hit, asked)
        except Exception as exc:  # Redis down: say so; the client may send it again
            session.served_from_cache[cmd.id] = served
            log.warning("event=cache_feedback_failed client_id=%s entry=%s error=%r", cmd.id, entry_id, exc)
            raise ProtocolError("unavailable", "the feedback could not be recorded; try again shortly", cmd.id) from None
        log.info("event=cache_feedback client_id=%s entry=%s verdict=%s evicted=%s", cmd.id, entry_id, cmd.verdict,
                 evicted)
        session.send(FeedbackRecorded(cmd.id, entry_id, evicted))
