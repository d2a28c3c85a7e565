"""`brigade chat`: a WebSocket client that prints tokens as they arrive."""
from __future__ import annotations

import json
import sys
import uuid

from websockets.asyncio.client import connect

from ops.settings import Settings


async def ask(ws, messages: list[dict], max_tokens: int, temperature: float) -> str | None:
    rid = uuid.uuid4().hex[:8]
    await ws.send(json.dumps({"type": "generate", "id": rid, "messages": messages,
                              "max_tokens": max_tokens, "temperature": temperature}))
    answer = ""
    async for frame in ws:
        event = json.loads(frame)
        if event.get("id") != rid:
            continue
        if event["type"] == "token":
            answer += event["text"]
            print(event["text"], end="", flush=True)
        elif event["type"] == "done":
            print(flush=True)
            return answer
        elif event["type"] == "error":
            print(f"\nerror {event['code']}: {event['message']}", file=sys.stderr)
            return None
    return None


async def chat(settings: Settings, question: str | None, max_tokens: int, temperature: float) -> int:
    async with connect(settings.ws_url, max_size=settings.max_message_bytes) as ws:
        if question is not None:
            return 0 if await ask(ws, [{"role": "user", "content": question}], max_tokens, temperature) is not None else 1
        history: list[dict] = []
        while True:
            try:
                line = input("> ")
            except EOFError:
                return 0
            if not line.strip():
                continue
            history.append({"role": "user", "content": line})
            answer = await ask(ws, history, max_tokens, temperature)
            if answer is None:
                history.pop()
            else:
                history.append({"role": "assistant", "content": answer})
