"""WebSocket clients for the integration tests (the real `websockets` client, real sockets)."""
from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass, field

from websockets.asyncio.client import connect


@dataclass
class Answer:
    id: str
    tokens: list[tuple[int, str]] = field(default_factory=list)
    end: dict | None = None  # the done or error event
    request_id: str | None = None

    @property
    def text(self) -> str:
        return "".join(t for _, t in self.tokens)

    @property
    def indexes(self) -> list[int]:
        return [i for i, _ in self.tokens]


def absorb(answers: dict[str, Answer], event: dict) -> None:
    """File one gateway event under its request."""
    a = answers.setdefault(event.get("id"), Answer(event.get("id")))
    if event["type"] == "queued":
        a.request_id = event["request_id"]
    elif event["type"] == "token":
        a.tokens.append((event["index"], event["text"]))
    elif event["type"] in ("done", "error"):
        a.end = event


async def collect(ws, answers: dict[str, Answer], errors: list[dict], until_ended: set[str], timeout: float = 120):
    """Read events until every id in `until_ended` has its done or error event."""
    async def loop():
        while not all(answers[i].end is not None for i in until_ended):
            event = json.loads(await ws.recv())
            rid = event.get("id")
            if event["type"] == "error" and (rid is None or rid not in answers):
                errors.append(event)
                continue
            absorb(answers, event)
    await asyncio.wait_for(loop(), timeout)


async def collect_one(ws, answers: dict[str, Answer], timeout: float = 60) -> None:
    absorb(answers, json.loads(await asyncio.wait_for(ws.recv(), timeout)))


async def start_long_request(ws, client_id: str, prompt: str, tokens_first: int = 3) -> dict[str, Answer]:
    """Send a request that runs for a long time and return once its first tokens have arrived."""
    await ws.send(json.dumps({"type": "generate", "id": client_id, "prompt": prompt, "max_tokens": 1000}))
    answers = {client_id: Answer(client_id)}
    while len(answers[client_id].tokens) < tokens_first:
        await collect_one(ws, answers)
    return answers


async def ask(url: str, client_id: str, **fields) -> Answer:
    async with connect(url, max_size=None) as ws:
        await ws.send(json.dumps({"type": "generate", "id": client_id, **fields}))
        answers = {client_id: Answer(client_id)}
        await collect(ws, answers, [], {client_id})
        return answers[client_id]


async def resume(url: str, rid: str, after_index: int) -> Answer:
    """Resume request `rid` after token `after_index` on a new connection, to its end."""
    async with connect(url) as ws:
        await ws.send(json.dumps({"type": "resume", "id": rid, "after_index": after_index}))
        answers = {rid: Answer(rid)}
        while answers[rid].end is None:
            absorb(answers, json.loads(await asyncio.wait_for(ws.recv(), 120)))
        return answers[rid]


async def ask_once(url: str) -> dict:
    """One short generate (client id "during"); returns the first event the gateway sends."""
    async with connect(url) as ws:
        await ws.send(json.dumps({"type": "generate", "id": "during", "prompt": "hi", "max_tokens": 4}))
        return json.loads(await asyncio.wait_for(ws.recv(), 30))


async def _converse(url: str, messages: list[tuple[str, dict]]) -> list[list[dict]]:
    """Send each frame on one connection and collect the events up to its done, error or feedback reply."""
    out = []
    async with connect(url) as ws:
        for client_id, frame in messages:
            await ws.send(json.dumps({"id": client_id, **frame}))
            events = []
            while not events or events[-1]["type"] not in ("done", "error", "feedback_recorded"):
                event = json.loads(await asyncio.wait_for(ws.recv(), 120))
                if event.get("id") == client_id:
                    events.append(event)
            out.append(events)
    return out


def _question(text: str) -> dict:
    # Short answers: only an answer that ended with `stop` is served to rewordings.
    return {"type": "generate", "max_tokens": 160,
            "messages": [{"role": "system", "content": "Answer in one short sentence."},
                         {"role": "user", "content": text}]}
