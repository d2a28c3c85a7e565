"""Waiting on one request's answer at an HTTP door: admitted into a queue of its events (a cached
answer's at once), read while watching for the client leaving (an HTTP client that goes away before
its answer starts shows it only by the disconnect message), and a worker's error as a refusal."""
from __future__ import annotations

import asyncio
from typing import Callable

from starlette.requests import Request

from gateway.admission.admission import Admission, Admitted
from gateway.admission.lifecycle import Caller
from gateway.delivery.events import ClientEvent, StreamError, Token
from gateway.delivery.router import AnswerQueue
from gateway.request import Generate, ProtocolError


class ClientGone(Exception):
    """The HTTP client went away before its answer was complete."""


async def admit(admission: Admission, cmd: Generate, caller: Caller) -> tuple[Admitted, AnswerQueue]:
    """Admit one request; its events (a cached answer's at once) wait in the queue returned."""
    answer = AnswerQueue()
    admitted = await admission.admit(cmd, caller, answer)
    for event in admitted.cached:
        answer.send(event)
    return admitted, answer


async def next_event(answer: AnswerQueue, gone: asyncio.Future) -> ClientEvent:
    """The next event of this request, unless the client leaves first (`gone` completes)."""
    if not answer.events.empty():
        return answer.events.get_nowait()
    get = asyncio.ensure_future(answer.events.get())
    try:
        await asyncio.wait({get, gone}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        if not get.done():  # the client left, or this wait was cancelled: nothing may wait on after it
            get.cancel()
    if get.cancelled():
        raise ClientGone()
    return get.result()


async def disconnected(request: Request) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def first_event(request: Request, answer: AnswerQueue, keep: Callable[[Token], object] | None) -> ClientEvent:
    """The event a response starts with: the first of all for a stream (`keep` None), else the end,
    each token before it handed to `keep`. Until then the request's only sign of a client that left
    is the disconnect message (ClientGone); a streaming response watches for it after that."""
    gone = asyncio.ensure_future(disconnected(request))
    try:
        event = await next_event(answer, gone)
        while keep is not None and isinstance(event, Token):
            keep(event)
            event = await next_event(answer, gone)
        return event
    finally:
        gone.cancel()


def stream_error(event: StreamError) -> ProtocolError:
    """A worker's error that ends a request before its answer began, as the door's refusal."""
    return ProtocolError(event.code, event.message)
