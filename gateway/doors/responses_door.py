"""The Responses API door: `POST /v1/responses` (JSON, SSE, or in the background), `GET` and `DELETE
/v1/responses/{id}`, `POST /v1/responses/{id}/cancel`.

A thin adapter, as the chat door is: the body becomes a `Generate` (gateway/doors/responses_schema.py)
admitted like any request (keys, limits, guards, cache, queue; a worker that dies mid-answer is
continued by another), and its typed events are rendered as a response (gateway/doors/responses_render.py).
A stored response (`store`, the default) is kept in Redis (gateway/doors/response_store.py), where
`previous_response_id` continues its conversation and any gateway reads it back. A `background`
response is answered at once, `in_progress`, and gathered by this gateway while its client polls
`GET`; `cancel` stops it from any gateway. A background response whose gateway stops before its
answer ends stays `in_progress` until it expires.
"""
from __future__ import annotations

import asyncio
import logging
import uuid
from typing import Callable

import redis.asyncio as aioredis
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from gateway.admission.admission import Admission, Admitted
from gateway.admission.auth import Authenticator
from gateway.admission.lifecycle import Caller, RequestLifecycle
from gateway.delivery.events import Done, StreamError, Token
from gateway.delivery.router import AnswerQueue
from gateway.doors import responses_render as render
from gateway.doors import responses_schema as rs
from gateway.doors import sse
from gateway.doors.answer_wait import ClientGone, admit, first_event, stream_error
from gateway.doors.http_body import read_json
from gateway.doors.http_errors import error_response, internal_error
from gateway.doors.response_store import ResponseStore, StoredResponse
from gateway.request import ProtocolError, RequestRules
from ops.core.settings import Settings

log = logging.getLogger("brigade.gateway")
RUNNING = ("queued", "in_progress")


class ResponsesDoor:
    def __init__(self, settings: Settings, rules: RequestRules, auth: Authenticator, admission: Admission,
                 lifecycle: RequestLifecycle, store: ResponseStore, spawn: Callable):
        self.settings = settings
        self.rules = rules
        self.auth = auth
        self.admission = admission
        self.lifecycle = lifecycle
        self.store = store
        self._spawn = spawn  # the gateway's: background work it waits for at shutdown
        # Background responses this gateway gathers: response id -> (its client id, the answer
        # queue the gatherer reads, set once the gatherer stored the response's end).
        self.gathering: dict[str, tuple[str, AnswerQueue, asyncio.Event]] = {}

    async def _caller(self, request: Request) -> Caller:
        return Caller(await self.auth.authenticate(request.headers.get("authorization")), "responses")

    @staticmethod
    def _owner(caller: Caller) -> str:
        return caller.key.id if caller.key else ""

    async def create(self, request: Request) -> Response:
        client_id = uuid.uuid4().hex[:16]
        try:
            caller = await self._caller(request)
            body = await read_json(request, self.settings.max_message_bytes)
            previous = await self._previous(body, self._owner(caller))
            cmd, opts = rs.parse(body, self.rules, client_id, previous)
            admitted, answer = await admit(self.admission, cmd, caller)
        except ProtocolError as err:
            return error_response(err)
        except Exception:
            return internal_error("responses_request_failed")
        response_id, created = render.new_id(), render.now()
        owner = self._owner(caller)
        headers = {"x-request-id": admitted.server_id or client_id}
        if opts.background:
            begun = render.response_object(response_id, opts, created, "in_progress")
            try:
                await self.store.put(StoredResponse(begun, opts.conversation, admitted.request_id, owner))
            except Exception as exc:  # nowhere to keep it: the client could never read it, so it must not run
                log.warning("event=response_store_failed response=%s error=%r", response_id, exc)
                self.lifecycle.abandon(admitted.request_id, answer)
                return error_response(ProtocolError("unavailable", "the response could not be stored; try again "
                                                    "shortly"), self.settings.retry_after_s)
            stored_end = asyncio.Event()
            self.gathering[response_id] = (client_id, answer, stored_end)
            self._spawn(self._gather(response_id, opts, created, answer, admitted, owner, stored_end))
            return JSONResponse(begun, headers=headers)
        text: list[str] = []
        try:
            event = await first_event(request, answer, None if opts.stream else lambda token: text.append(token.text))
        except ClientGone:
            self.lifecycle.abandon(admitted.request_id, answer)
            return Response(status_code=499)
        if isinstance(event, StreamError):
            return error_response(stream_error(event), self.settings.retry_after_s)
        if opts.stream:
            return sse.response(self._stream(response_id, opts, created, answer, event, admitted, owner), headers)
        whole = render.finished(response_id, opts, created, "".join(text), event, admitted.request_id)
        await self._keep(whole, opts, owner)
        return JSONResponse(whole, headers=headers)

    async def _previous(self, body, owner: str) -> list[dict] | None:
        """The conversation `previous_response_id` continues (its input and its answer)."""
        ref = body.get("previous_response_id") if isinstance(body, dict) else None
        if ref is None:
            return None
        if not isinstance(ref, str):
            raise ProtocolError("invalid_field", "`previous_response_id` must be a string", None,
                                "previous_response_id")
        stored = await self._read(ref, owner)
        if stored is None:
            raise ProtocolError("not_found", f"no stored response {ref[:64]!r} (never stored, deleted or expired)",
                                None, "previous_response_id")
        if stored.response.get("status") in RUNNING:
            raise ProtocolError("invalid_field", f"the response {ref[:64]!r} has not finished yet", None,
                                "previous_response_id")
        return stored.conversation

    async def _keep(self, whole: dict, opts: rs.ResponseOptions, owner: str) -> None:
        """A finished response, stored when asked (the default): its conversation, its answer appended."""
        if not opts.store:
            return
        conversation = opts.conversation + render.as_messages(whole["output"])
        try:
            await self.store.put(StoredResponse(whole, conversation, None, owner))
        except Exception as exc:  # Redis away: the client has its answer; only the record is lost
            log.warning("event=response_store_failed response=%s error=%r", whole["id"], exc)

    async def _stream(self, response_id: str, opts: rs.ResponseOptions, created: int, answer: AnswerQueue,
                      first, admitted: Admitted, owner: str):
        stream = render.ResponseStream(response_id, opts, created)
        event, ended = first, False
        try:
            for out in stream.start():
                yield sse.event(out, out["type"])
            while True:
                if isinstance(event, Token):
                    for out in stream.token(event):
                        yield sse.event(out, out["type"])
                elif isinstance(event, (Done, StreamError)):
                    ended = True
                    pieces = stream.done(event, admitted.request_id) if isinstance(event, Done) else stream.error(event)
                    for out in pieces:
                        yield sse.event(out, out["type"])
                    await self._keep(stream.final, opts, owner)
                    return
                event = await answer.events.get()
        finally:
            if not ended:  # the client went away mid-stream (or the gateway stops): free the slot
                self.lifecycle.abandon(admitted.request_id, answer)

    async def _gather(self, response_id: str, opts: rs.ResponseOptions, created: int, answer: AnswerQueue,
                      admitted: Admitted, owner: str, stored_end: asyncio.Event) -> None:
        """A background response: its events gathered here, the whole response stored at its end."""
        text: list[str] = []
        try:
            while True:
                event = await answer.events.get()
                if isinstance(event, Token):
                    text.append(event.text)
                elif isinstance(event, (Done, StreamError)):
                    whole = (render.finished(response_id, opts, created, "".join(text), event, admitted.request_id)
                             if isinstance(event, Done) else render.failed(response_id, opts, created, event))
                    if await self._still_stored(response_id):  # a DELETE meanwhile: not stored again
                        await self._keep(whole, opts, owner)
                    return
        finally:
            self.gathering.pop(response_id, None)
            stored_end.set()

    async def _still_stored(self, response_id: str) -> bool:
        try:
            return await self.store.exists(response_id)
        except aioredis.RedisError:
            return True  # unknown: keep the end (its put says whether Redis is back)

    async def retrieve(self, request: Request) -> Response:
        try:
            stored = await self._stored(request)
            if request.query_params.get("stream") not in (None, "false"):
                raise ProtocolError("unsupported_field", "`stream` on GET is not supported: poll the response, or "
                                    "create it with `stream: true`", None, "stream")
        except ProtocolError as err:
            return error_response(err)
        return JSONResponse(stored.response)

    async def delete(self, request: Request) -> Response:
        try:
            stored = await self._stored(request)
        except ProtocolError as err:
            return error_response(err)
        try:
            await self.store.delete(stored.id)
        except aioredis.RedisError:
            return error_response(ProtocolError("unavailable", "the response could not be deleted now; try again "
                                                 "shortly"), self.settings.retry_after_s)
        if stored.response.get("status") in RUNNING:  # deleted while it runs: it stops, and (gone first) its
            self._stop(stored)  # gatherer finds nothing to store its end in
        return JSONResponse({"id": stored.id, "object": "response.deleted", "deleted": True})

    async def cancel(self, request: Request) -> Response:
        """A background response stops, from any gateway; a finished one is answered as it is."""
        try:
            stored = await self._stored(request)
            if not stored.response.get("background"):
                raise ProtocolError("not_cancellable", "only a response created with `background: true` can be "
                                    "cancelled", None, "response_id")
        except ProtocolError as err:
            return error_response(err)
        if stored.response.get("status") not in RUNNING:
            return JSONResponse(stored.response)
        stored_end = self._stop(stored)
        if stored_end is not None:  # this gateway gathers it: the gatherer stores what was made by then
            await stored_end.wait()
            return JSONResponse((await self._read(stored.id, stored.owner) or stored).response)
        # Another gateway's: its worker stops, and that gateway stores the end (writing it here too
        # could overwrite an end it stored a moment ago).
        return JSONResponse({**stored.response, "status": "cancelled"})

    def _stop(self, stored: StoredResponse) -> asyncio.Event | None:
        """A running background response stops: here, its route ends and its gatherer hears why
        (the event returned is set once the gatherer stored the end); elsewhere, its worker stops."""
        here = self.gathering.get(stored.id)
        if here is not None:
            client_id, answer, stored_end = here
            self.lifecycle.cancel(stored.request_id, answer)
            answer.send(Done.cancelled(client_id))
            return stored_end
        if stored.request_id is not None:
            self.lifecycle.cancel(stored.request_id, None)
        return None

    async def _stored(self, request: Request) -> StoredResponse:
        caller = await self._caller(request)
        response_id = request.path_params["response_id"]
        stored = await self._read(response_id, self._owner(caller))
        if stored is None:
            raise ProtocolError("not_found", f"no stored response {response_id[:64]!r} (never stored, deleted or "
                                "expired)", None, "response_id")
        return stored


    async def _read(self, response_id: str, owner: str) -> StoredResponse | None:
        try:
            return await self.store.get(response_id, owner)
        except aioredis.RedisError:
            raise ProtocolError("unavailable", "stored responses cannot be read now; try again shortly",
                                retry_after_s=self.settings.retry_after_s) from None
