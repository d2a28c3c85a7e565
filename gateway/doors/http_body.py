"""A JSON request body, read no further than the largest message the gateway takes (as for
WebSocket frames), for every HTTP door that takes one: an oversized body is refused before it
is all in memory, and a body that is not JSON gets the stable code `invalid_json`.
"""
from __future__ import annotations

import json
from typing import Any

from starlette.requests import Request

from gateway.request import ProtocolError


async def read_body(request: Request, limit: int) -> bytes:
    too_big = ProtocolError("prompt_too_long", f"the request body is larger than {limit} bytes")
    if int(request.headers.get("content-length") or 0) > limit:
        raise too_big
    body = bytearray()
    async for piece in request.stream():
        body += piece
        if len(body) > limit:
            raise too_big
    return bytes(body)


async def read_json(request: Request, limit: int) -> Any:
    raw = await read_body(request, limit)
    try:
        return json.loads(raw)
    except (ValueError, RecursionError):
        raise ProtocolError("invalid_json", "the request body is not valid JSON") from None
