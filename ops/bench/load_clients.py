"""The clients of the benchmarks that break a fleet (`bench soak`, `bench chaos`), and what they saw.

Each client loops: ask, read the answer to its end, ask again, until the run's deadline (a request
in flight at the deadline is finished). A WebSocket client whose connection breaks moves to the
next gateway and sends `resume` for its request (docs/websocket.md), or sends the request again if
the break came before its `queued` event (nothing was promised yet). An SSE client (OpenAI's
streaming chat) cannot resume: a stream cut by its own gateway's death is counted apart from the
failures, with how it ended, and the next request goes to the next gateway. Every answer's tokens
are checked: WebSocket indexes for repeats, gaps and disorder against the `done` event's count,
SSE chunks (one logprob entry per token) against the usage chunk's count. No client here cancels,
so a `done` whose finish reason is `cancelled` is a failure.
"""
from __future__ import annotations

import asyncio
import json
import random
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Callable

import httpx
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed, InvalidHandshake

from ops.core.percentiles import percentile

QUESTIONS = [
    "What is the capital of France?", "Name three colors.", "Why is the sky blue?", "Give me a tip for sleeping well.",
    "What is 12 times 7?", "Write a haiku about rain.", "Name a famous painter.", "What do bees make?",
    "Translate 'hello' into Spanish.", "What is the largest ocean?", "Suggest a name for a cat.",
    "How many legs does a spider have?",
]
RECV_TIMEOUT_S = 120  # an answer silent this long is a failure ("timeout"), not a hang of the run (nor, in
# `make test-long`, a test stopped by its timeout before the run could report what it lost)
MAX_RECONNECTS = 6  # per request: a request that needs more is a failure
FAILURES_LISTED = 500  # the report lists the first failures one by one (the counts are whole)


def _seconds(value: float | None) -> float | None:
    """A latency as the report gives it (to 0.1 ms)."""
    return None if value is None else round(value, 4)


@dataclass
class TokenOrder:
    """One stream's token indexes as they arrived."""

    received: set[int] = field(default_factory=set)
    last: int = -1
    duplicated: int = 0
    out_of_order: int = 0

    def add(self, index: int) -> None:
        if index in self.received:
            self.duplicated += 1
            return
        if index != self.last + 1:
            self.out_of_order += 1
        self.received.add(index)
        self.last = max(self.last, index)

    def skipped(self, total: int) -> int:
        """Indexes below `total` (the tokens the answer had) that never arrived."""
        return sum(1 for i in range(total) if i not in self.received)


@dataclass
class Tally:
    """What one door's clients saw, for the report."""

    t0: float
    sent: int = 0
    completed: int = 0
    failed: Counter[str] = field(default_factory=Counter)
    failures: list[dict] = field(default_factory=list)
    broken_streams: int = 0
    duplicated_tokens: int = 0
    skipped_tokens: int = 0
    ttft: list[float] = field(default_factory=list)
    e2e: list[float] = field(default_factory=list)
    resumed: int = 0  # WebSocket streams continued on a new connection with `resume`
    resent: int = 0  # WebSocket requests sent again: the connection broke before their `queued`
    cut_by_gateway_kill: Counter[str] = field(default_factory=Counter)  # SSE: how each such stream ended
    connect_retries: int = 0  # connections refused or broken while no request was in flight
    broken: list[dict] = field(default_factory=list)  # the first broken streams, each with what was wrong

    def fail(self, code: str, **about) -> None:
        self.failed[code] += 1
        if len(self.failures) < FAILURES_LISTED:
            self.failures.append({"at_s": round(time.monotonic() - self.t0, 2), "code": code, **about})

    def answered(self, order: TokenOrder, tokens: int, sent: float, first: float | None, **about) -> None:
        """An answer ended normally with `tokens` tokens (the server's count); `about` names it in
        the report if its stream was broken."""
        now = time.monotonic()
        self.completed += 1
        self.ttft.append((first or now) - sent)
        self.e2e.append(now - sent)
        skipped = order.skipped(tokens)
        extra = len(order.received) - (tokens - skipped)  # indexes beyond the count: duplicates too
        self.duplicated_tokens += order.duplicated + extra
        self.skipped_tokens += skipped
        if order.duplicated or extra or skipped or order.out_of_order:
            self.broken_streams += 1
            if len(self.broken) < FAILURES_LISTED:
                missing = [i for i in range(tokens) if i not in order.received]
                self.broken.append({"at_s": round(now - self.t0, 2), "tokens": tokens, "missing": missing[:20],
                                    "duplicated": order.duplicated + extra, "out_of_order": order.out_of_order,
                                    **about})

    def report(self) -> dict:
        out = {"requests_sent": self.sent, "requests_completed": self.completed,
               "requests_failed": dict(self.failed), "broken_streams": self.broken_streams,
               "tokens_duplicated": self.duplicated_tokens, "tokens_skipped": self.skipped_tokens,
               "ttft_s": {"p50": _seconds(percentile(self.ttft, 50)), "p99": _seconds(percentile(self.ttft, 99))},
               "e2e_s": {"p50": _seconds(percentile(self.e2e, 50)), "p99": _seconds(percentile(self.e2e, 99))},
               "connect_retries": self.connect_retries}
        if self.resumed or self.resent:
            out.update(resumed=self.resumed, resent_before_queued=self.resent)
        if self.cut_by_gateway_kill:
            out["cut_by_gateway_kill"] = dict(self.cut_by_gateway_kill)
        out["failures"] = self.failures
        out["broken"] = self.broken
        return out


@dataclass
class Deadline:
    """When the clients stop asking. `held` keeps the load on past `at`: `bench chaos` holds it
    while a planned fault waits for a whole fleet, so no fault happens to an idle one."""

    at: float
    held: bool = False

    def passed(self) -> bool:
        return not self.held and time.monotonic() >= self.at

    def at_least(self, at: float) -> None:
        self.at = max(self.at, at)


@dataclass
class InFlight:
    """The request a WebSocket client waits on."""

    cid: str
    prompt: str
    sent: float
    request_id: str | None = None
    first: float | None = None
    order: TokenOrder = field(default_factory=TokenOrder)
    reconnects: int = 0
    resumed_after: list[int] = field(default_factory=list)  # the after_index of each resume sent


async def websocket_client(urls: list[str], n: int, until: Deadline, max_tokens: int, tally: Tally) -> None:
    """Client n, starting on gateway n mod len(urls): ask, read to the end, ask again, until `until`."""
    rng = random.Random(n)
    g = n % len(urls)
    asking: InFlight | None = None
    while asking is not None or not until.passed():
        try:
            async with connect(urls[g], open_timeout=30, max_size=None) as ws:
                if asking is not None:  # the connection broke under it
                    if asking.request_id is None:
                        tally.resent += 1
                        await ws.send(_generate(asking, max_tokens))
                    else:
                        tally.resumed += 1
                        asking.resumed_after.append(asking.order.last)
                        await ws.send(json.dumps({"type": "resume", "id": asking.request_id,
                                                  "after_index": asking.order.last}))
                while True:
                    if asking is None:
                        if until.passed():
                            return
                        asking = InFlight(f"w{n}-{tally.sent}", rng.choice(QUESTIONS), time.monotonic())
                        tally.sent += 1
                        await ws.send(_generate(asking, max_tokens))
                    await _read_answer(ws, asking, tally, urls[g])
                    asking = None
        except (OSError, asyncio.TimeoutError, ConnectionClosed, InvalidHandshake) as exc:
            g = (g + 1) % len(urls)
            if asking is None:
                tally.connect_retries += 1
            else:
                asking.reconnects += 1
                if asking.reconnects > MAX_RECONNECTS:
                    tally.fail(f"connection:{type(exc).__name__}", door="websocket", request_id=asking.request_id)
                    asking = None
            await asyncio.sleep(0.2)


def _generate(asking: InFlight, max_tokens: int) -> str:
    return json.dumps({"type": "generate", "id": asking.cid, "prompt": asking.prompt, "max_tokens": max_tokens,
                       "cache": "off"})


async def _read_answer(ws, asking: InFlight, tally: Tally, url: str) -> None:
    """Events until the request's done or error; a silent answer is a failure ("timeout")."""
    while True:
        try:
            event = json.loads(await asyncio.wait_for(ws.recv(), RECV_TIMEOUT_S))
        except asyncio.TimeoutError:
            tally.fail("timeout", door="websocket", request_id=asking.request_id, gateway=url)
            return
        if event.get("id") not in (asking.cid, asking.request_id):
            continue
        kind = event["type"]
        if kind == "queued":
            asking.request_id = event["request_id"]
        elif kind == "token":
            asking.first = asking.first or time.monotonic()
            asking.order.add(event["index"])
        elif kind == "done" and event.get("finish_reason") == "cancelled":  # no client here cancels
            tally.fail("cancelled", door="websocket", request_id=asking.request_id, gateway=url,
                       tokens=event.get("usage", {}).get("completion_tokens"), tokens_before=len(asking.order.received))
            return
        elif kind == "done":
            tally.answered(asking.order, event.get("usage", {}).get("completion_tokens", asking.order.last + 1),
                           asking.sent, asking.first, request_id=asking.request_id, reconnects=asking.reconnects,
                           resumed_after=asking.resumed_after, gateway=url)
            return
        elif kind == "error":
            tally.fail(event.get("code", "?"), door="websocket", request_id=asking.request_id, gateway=url,
                       message=event.get("message"), tokens_before=len(asking.order.received))
            return


async def sse_client(urls: list[str], n: int, until: Deadline, max_tokens: int, tally: Tally,
                     killed_between: Callable[[int, float, float], bool]) -> None:
    """SSE client n, starting on gateway n mod len(urls). `killed_between(g, t1, t2)`: was gateway g
    killed in that span (a stream cut then was cut by its own gateway's death)."""
    rng = random.Random(10_000 + n)
    g = n % len(urls)
    async with httpx.AsyncClient(timeout=httpx.Timeout(RECV_TIMEOUT_S, connect=10)) as http:
        while not until.passed():
            body = {"messages": [{"role": "user", "content": rng.choice(QUESTIONS)}], "max_tokens": max_tokens,
                    "stream": True, "stream_options": {"include_usage": True}, "logprobs": True}
            sent = time.monotonic()
            try:
                tally.sent += 1
                await _read_sse(http, f"{urls[g]}/v1/chat/completions", body, sent, tally)
            except httpx.ConnectError:
                tally.sent -= 1  # never reached a gateway: not a request
                tally.connect_retries += 1
                g = (g + 1) % len(urls)
                await asyncio.sleep(0.2)
            except httpx.TransportError as exc:
                if killed_between(g, sent, time.monotonic() + 1):
                    tally.cut_by_gateway_kill[type(exc).__name__] += 1
                else:
                    tally.fail(f"connection:{type(exc).__name__}", door="sse", gateway=urls[g])
                g = (g + 1) % len(urls)


async def _read_sse(http, url: str, body: dict, sent: float, tally: Tally) -> None:
    order, first, usage = TokenOrder(), None, None
    async with http.stream("POST", url, json=body) as resp:
        if resp.status_code != 200:
            raw = await resp.aread()
            try:
                code = json.loads(raw)["error"]["code"]
            except (ValueError, KeyError, TypeError):
                code = f"http_{resp.status_code}"
            tally.fail(code, door="sse", status=resp.status_code, request_id=resp.headers.get("x-request-id"))
            return
        rid = resp.headers.get("x-request-id")
        async for line in resp.aiter_lines():
            if not line.startswith("data: "):
                continue
            data = line[len("data: "):]
            if data == "[DONE]":
                break
            chunk = json.loads(data)
            if "error" in chunk:
                tally.fail(chunk["error"].get("code") or "?", door="sse", request_id=rid,
                           message=chunk["error"].get("message"), tokens_before=len(order.received))
                return
            usage = chunk.get("usage") or usage
            for choice in chunk.get("choices", []):
                for _ in (choice.get("logprobs") or {}).get("content") or []:
                    first = first or time.monotonic()
                    order.add(order.last + 1)  # SSE has no indexes: a count, checked against usage
        if usage is None:
            tally.fail("no_usage", door="sse", request_id=rid)  # [DONE] without the usage chunk
            return
        tally.answered(order, usage["completion_tokens"], sent, first, request_id=rid)
