"""Server-sent events, as every streaming HTTP door sends them (the OpenAI API, the Responses API):
one response type with the headers that keep a proxy from buffering it, and one way to write an
event."""
from __future__ import annotations

import json
from typing import AsyncIterator

from starlette.responses import StreamingResponse

# No cache, and no buffering by a proxy in front (nginx reads X-Accel-Buffering): each event must
# reach the client as it is written, a token at a time.
HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
DONE = "data: [DONE]\n\n"  # the OpenAI stream's last line


def event(body: dict, name: str | None = None) -> str:
    """One event: its JSON on one `data:` line, after an `event:` line when it is named (the
    Responses API names each)."""
    data = f"data: {json.dumps(body, separators=(',', ':'))}\n\n"
    return f"event: {name}\n{data}" if name else data


def response(events: AsyncIterator[str], headers: dict[str, str]) -> StreamingResponse:
    return StreamingResponse(events, media_type="text/event-stream", headers={**headers, **HEADERS})
