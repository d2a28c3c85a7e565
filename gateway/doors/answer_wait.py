"""Waiting on one answer's events at an HTTP door while watching for its client to leave: an HTTP
client that goes away before its answer starts shows it only by the disconnect message."""
from __future__ import annotations

import asyncio

from starlette.requests import Request

from gateway.delivery.events import ClientEvent
from gateway.delivery.router import AnswerQueue


class ClientGone(Exception):
    pass


async def next_event(answer: AnswerQueue, gone: asyncio.Future) -> ClientEvent:
    """The next event of this request, unless the client leaves first (`gone` completes)."""
    if not answer.events.empty():
        return answer.events.get_nowait()
    get = asyncio.ensure_future(answer.events.get())
    await asyncio.wait({get, gone}, return_when=asyncio.FIRST_COMPLETED)
    if get.done():
        return get.result()
    get.cancel()
    raise ClientGone()


async def disconnected(request: Request) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass
