"""The OpenAI-compatible HTTP door: /v1/chat/completions, /v1/completions (JSON or SSE), /v1/models.

A thin adapter: the body becomes a `Generate` (gateway/doors/openai_schema.py), the gateway admits it
like any WebSocket request, and the request's typed events (gateway/delivery/events.py) are
rendered as an OpenAI response. A completions body with several prompts is a request per prompt,
gathered into one body (gateway/doors/http_answers.py); it is not streamed. A streamed response
starts only with the first token, so an error a worker reports before any token (a prompt past the
context, a deadline) still gets its proper status; a failure after streaming began is sent as a
last `data: {"error": ...}` event. A client that goes away cancels its request at once: an HTTP
client cannot resume.
"""
from __future__ import annotations

import asyncio
import uuid

import redis.asyncio as aioredis
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from gateway.admission.admission import Admission
from gateway.admission.auth import Authenticator
from gateway.admission.catalog import Catalog
from gateway.admission.lifecycle import Caller, RequestLifecycle
from gateway.delivery.events import ClientEvent, Done, StreamError, Token
from gateway.delivery.router import AnswerQueue
from gateway.doors import http_answers as answers
from gateway.doors import openai_render as render
from gateway.doors import openai_schema as oa
from gateway.doors import sse
from gateway.doors.answer_wait import ClientGone, admit, disconnected, first_event, stream_error
from gateway.doors.http_body import read_json
from gateway.doors.http_errors import error_response, internal_error
from gateway.request import Generate, ProtocolError, RequestRules
from ops.core.settings import Settings


class OpenAIDoor:
    def __init__(self, settings: Settings, rules: RequestRules, auth: Authenticator, admission: Admission,
                 lifecycle: RequestLifecycle, catalog: Catalog):
        self.settings = settings
        self.rules = rules
        self.auth = auth
        self.admission = admission
        self.lifecycle = lifecycle
        self.catalog = catalog

    async def caller(self, request: Request) -> Caller:
        return Caller(await self.auth.authenticate(request.headers.get("authorization")), "http")

    async def models(self, request: Request) -> Response:
        try:
            await self.caller(request)
        except ProtocolError as err:
            return error_response(err)
        try:
            await self.catalog.observe_now()
        except aioredis.RedisError:
            pass  # the load monitor's view of a second ago
        return JSONResponse({"object": "list", "data": self.catalog.cards()})

    async def chat_completions(self, request: Request) -> Response:
        return await self._complete(request, chat=True)

    async def completions(self, request: Request) -> Response:
        return await self._complete(request, chat=False)

    async def _complete(self, request: Request, chat: bool) -> Response:
        client_id = uuid.uuid4().hex[:16]
        try:
            caller = await self.caller(request)
            body = await read_json(request, self.settings.max_message_bytes)
            asks = oa.parse_prompts(body, chat, self.rules, client_id)
            if len(asks) > 1:
                return await self._several(request, caller, asks, client_id)
            cmd, opts = asks[0]
            admitted, answer = await admit(self.admission, cmd, caller)
        except ProtocolError as err:
            return error_response(err)
        except Exception:
            return internal_error("http_request_failed")
        rid = admitted.server_id or client_id
        gathered = render.Answer(opts.n)
        try:  # an answer in one body is gathered first
            event = await first_event(request, answer, None if opts.stream else gathered.add)
        except ClientGone:
            self.lifecycle.abandon(admitted.request_id, answer)
            return Response(status_code=499)
        if isinstance(event, StreamError):
            return error_response(stream_error(event), self.settings.retry_after_s)
        headers = {"x-request-id": rid}
        if admitted.version:
            headers["x-brigade-model-version"] = admitted.version
        if opts.stream:
            return sse.response(self._stream(answer, opts, rid, event, admitted.request_id), headers)
        body = render.completion_body(opts, rid, gathered, event, render.now(), admitted.request_id)
        headers.update(_timing_headers(body["brigade"]))
        return JSONResponse(body, headers=headers)

    async def _several(self, request: Request, caller: Caller, asks: list[tuple[Generate, oa.Options]],
                       client_id: str) -> Response:
        """Several prompts of one completions body, each its own request (gateway/doors/http_answers.py),
        answered in one body."""
        gone = asyncio.ensure_future(disconnected(request))
        try:
            parts = await answers.answer_prompts(asks, caller, self.admission, self.lifecycle, gone)
        except ClientGone:
            return Response(status_code=499)
        except ProtocolError as err:
            return error_response(err, self.settings.retry_after_s)
        finally:
            gone.cancel()
        body = render.prompts_body([(p.opts, p.answer, p.done, p.admitted.server_id) for p in parts], client_id,
                                   render.now())
        return JSONResponse(body, headers={"x-request-id": client_id})

    async def _stream(self, answer: AnswerQueue, opts: oa.Options, rid: str, first: ClientEvent,
                      request_id: str | None):
        stream = render.ChunkStream(opts, rid)
        event, ended = first, False
        try:
            while True:
                if isinstance(event, Token):
                    for body in stream.token(event):
                        yield sse.event(body)
                elif isinstance(event, Done):
                    ended = True
                    for body in stream.done(event, request_id):
                        yield sse.event(body)
                    yield sse.DONE
                    return
                elif isinstance(event, StreamError):
                    ended = True
                    err = stream_error(event)
                    yield sse.event(oa.error_body(err.code, err.message, err.field))
                    yield sse.DONE
                    return
                event = await answer.events.get()
        finally:
            if not ended:  # the client went away mid-stream (or the gateway stops): free the slot
                self.lifecycle.abandon(request_id, answer)


def _timing_headers(extra: dict) -> dict:
    headers = {"x-brigade-cache": extra.get("cached") or "miss"}
    for name, value in (extra.get("timing") or {}).items():
        if value is not None:
            headers[f"x-brigade-{name.replace('_', '-')}"] = str(value)
    return headers
