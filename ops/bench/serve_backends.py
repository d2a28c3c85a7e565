"""How `brigade bench serve` asks and times one request: Brigade's WebSocket protocol (many requests
per connection) or the OpenAI streaming API (httpx SSE, any OpenAI-compatible server), each piece's
arrival timed as the client sees it.

Every request ends in its RequestResult, failed ones with an error code (`connect_failed`,
`client_timeout`, `http_503`, the server's own code); only a target that does not answer at all
raises (CannotReach). `ask` returns the answer's text as it streamed in (the chat-turns workload
sends it back as the next turn's history).
"""
from __future__ import annotations

import asyncio
import json
import time
import uuid

import httpx
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed, InvalidHandshake, InvalidStatus

from ops.bench.serve_config import LoadConfig
from ops.bench.serve_stats import RequestResult
from ops.bench.serve_workload import PlannedRequest

# Requests one WebSocket connection carries at once (the gateway's per-connection limit is 64).
REQUESTS_PER_CONNECTION = 32


class CannotReach(Exception):
    """The target does not answer at all: nothing to measure."""


# ---- the timing of one answer -------------------------------------------------------------------


class AnswerClock:
    """Times one request's pieces as they arrive: the first with text sets TTFT, each next one adds a gap."""

    def __init__(self, result: RequestResult, run_start: float):
        self.result = result
        self.started = time.perf_counter()
        result.start_s = self.started - run_start
        self.last: float | None = None
        self.pieces = 0
        self.texts: list[str] = []

    @property
    def text(self) -> str:
        return "".join(self.texts)

    def piece(self, text: str | None) -> None:
        if not text:
            return
        self.texts.append(text)
        now = time.perf_counter()
        if self.last is None:
            self.result.ttft_s = now - self.started
        else:
            self.result.itl_s.append(now - self.last)
        self.last = now
        self.pieces += 1

    def end(self, error: str | None = None, output_tokens: int | None = None,
            prompt_tokens: int | None = None) -> None:
        self.result.e2e_s = time.perf_counter() - self.started
        self.result.error = error
        self.result.output_tokens = output_tokens if output_tokens else self.pieces
        self.result.prompt_tokens = prompt_tokens
        if error is None and self.result.ttft_s is None:
            self.result.ttft_s = self.result.e2e_s  # no text at all: the first token never came before the end


# ---- backends -------------------------------------------------------------------------------------


class OpenAIBackend:
    """POST /v1/chat/completions with `stream: true`, read as SSE with httpx; works with any
    OpenAI-compatible server. Brigade's cache verdict rides in the last chunk's `brigade.cached`."""

    def __init__(self, config: LoadConfig):
        self.config = config
        self.headers = {"Authorization": f"Bearer {config.api_key}"} if config.api_key else {}
        # No pool limit: the load generator must never be what queues the requests.
        self.client = httpx.AsyncClient(timeout=httpx.Timeout(config.timeout_s, connect=10),
                                        limits=httpx.Limits(max_connections=None, max_keepalive_connections=256))
        self.model = config.model

    async def check(self) -> None:
        """The server answers /v1/models; without --model, its first model is the one asked."""
        try:
            r = await self.client.get(self.config.http_base + "/v1/models", headers=self.headers, timeout=10)
        except httpx.HTTPError as exc:
            raise CannotReach(f"{self.config.http_base} does not answer: {exc!r}") from None
        if self.model is None:
            try:
                self.model = r.json()["data"][0]["id"]
            except (ValueError, KeyError, IndexError, TypeError):
                raise CannotReach(f"{self.config.http_base}/v1/models answered {r.status_code} without a model; "
                                  "name one with --model") from None

    def body(self, request: PlannedRequest) -> dict:
        body = {"model": self.model, "messages": list(request.messages), "temperature": self.config.temperature,
                "stream": True, "stream_options": {"include_usage": True}}
        if request.max_tokens:
            body["max_tokens"] = request.max_tokens
        if self.config.cache:
            body["cache"] = self.config.cache
        if self.config.ignore_eos:
            body["ignore_eos"] = True  # an extra body field, as vLLM's OpenAI server takes it
        if self.config.logit_bias:
            body["logit_bias"] = {str(token): bias for token, bias in self.config.logit_bias.items()}
        return body

    async def ask(self, request: PlannedRequest, result: RequestResult, run_start: float) -> str:
        clock = AnswerClock(result, run_start)
        tokens = prompt_tokens = None
        try:
            async with self.client.stream("POST", self.config.url, json=self.body(request),
                                          headers=self.headers) as r:
                if r.status_code != 200:
                    clock.end(_http_error_code(r.status_code, await r.aread()))
                    return clock.text
                error = None
                async for line in r.aiter_lines():
                    if not line.startswith("data:"):
                        continue
                    data = line[5:].strip()
                    if data == "[DONE]":
                        break
                    try:
                        chunk = json.loads(data)
                    except json.JSONDecodeError:
                        error = "invalid_stream"
                        break
                    if "error" in chunk:
                        error = _error_code(chunk["error"], "stream_error")
                        break
                    for choice in chunk.get("choices") or ():
                        clock.piece((choice.get("delta") or {}).get("content") or choice.get("text"))
                        result.finish_reason = choice.get("finish_reason") or result.finish_reason
                    if chunk.get("usage"):
                        tokens = chunk["usage"].get("completion_tokens")
                        prompt_tokens = chunk["usage"].get("prompt_tokens")
                    extra = chunk.get("brigade")
                    if isinstance(extra, dict):
                        result.cached = extra.get("cached") or None
                        result.finish_reason = extra.get("finish_reason") or result.finish_reason
                clock.end(error, tokens, prompt_tokens)
        except httpx.ConnectError:
            clock.end("connect_failed")
        except httpx.TimeoutException:
            clock.end("client_timeout")
        except httpx.HTTPError:
            clock.end("connection_closed")
        return clock.text

    async def close(self) -> None:
        await self.client.aclose()


def _error_code(error, fallback: str) -> str:
    if isinstance(error, dict):
        code = error.get("code") or error.get("type")
        if code:
            return str(code)
    return fallback


def _http_error_code(status: int, body: bytes) -> str:
    try:
        return _error_code(json.loads(body).get("error"), f"http_{status}")
    except (ValueError, AttributeError):
        return f"http_{status}"


class WebSocketLane:
    """One WebSocket connection carrying many requests; a reader hands each event to its request."""

    def __init__(self, ws: ClientConnection):
        self.ws = ws
        self.waiting: dict[str, asyncio.Queue] = {}
        self.closing_error: str | None = None
        self.reader = asyncio.create_task(self._read())

    async def _read(self) -> None:
        try:
            async for frame in self.ws:
                event = json.loads(frame)
                queue = self.waiting.get(event.get("id"))
                if queue is not None:
                    queue.put_nowait(event)
                elif event.get("type") == "error":
                    self.closing_error = event.get("code")  # e.g. unauthorized, just before a close
        except (ConnectionClosed, json.JSONDecodeError):
            pass
        finally:
            for queue in self.waiting.values():
                queue.put_nowait({"type": "error", "code": self.closing_error or "connection_closed"})

    @property
    def open(self) -> bool:
        return not self.reader.done()


class WebSocketBackend:
    """Brigade's WebSocket protocol, REQUESTS_PER_CONNECTION requests per connection."""

    def __init__(self, config: LoadConfig):
        self.config = config
        self.headers = {"Authorization": f"Bearer {config.api_key}"} if config.api_key else {}
        self.lanes: list[WebSocketLane] = []
        self.opening = asyncio.Lock()
        self.run_id = uuid.uuid4().hex[:6]

    async def check(self) -> None:
        try:
            await self._lane()
        except (OSError, InvalidHandshake, asyncio.TimeoutError) as exc:
            raise CannotReach(f"{self.config.url} does not answer: {exc!r}") from None

    async def _lane(self) -> WebSocketLane:
        async with self.opening:
            for lane in self.lanes:
                if lane.open and len(lane.waiting) < REQUESTS_PER_CONNECTION:
                    return lane
            ws = await connect(self.config.url, additional_headers=self.headers, max_size=None, open_timeout=10)
            lane = WebSocketLane(ws)
            self.lanes.append(lane)
            return lane

    def frame(self, request: PlannedRequest, rid: str) -> dict:
        frame = {"type": "generate", "id": rid, "messages": list(request.messages),
                 "temperature": self.config.temperature}
        if request.max_tokens:
            frame["max_tokens"] = request.max_tokens
        if self.config.model:
            frame["model"] = self.config.model
        if self.config.cache:
            frame["cache"] = self.config.cache
        if self.config.ignore_eos:
            frame["ignore_eos"] = True
        return frame

    async def ask(self, request: PlannedRequest, result: RequestResult, run_start: float) -> str:
        rid = f"{self.run_id}-{request.index}"
        queue: asyncio.Queue = asyncio.Queue()
        try:
            lane = await self._lane()
        except InvalidStatus as exc:
            AnswerClock(result, run_start).end(f"http_{exc.response.status_code}")
            return ""
        except (OSError, InvalidHandshake, asyncio.TimeoutError):
            AnswerClock(result, run_start).end("connect_failed")
            return ""
        lane.waiting[rid] = queue
        clock = AnswerClock(result, run_start)
        ended = False
        try:
            await lane.ws.send(json.dumps(self.frame(request, rid)))
            while True:
                event = await queue.get()
                kind = event.get("type")
                if kind == "token":
                    clock.piece(event.get("text"))
                    if event.get("cached"):
                        result.cached = event["cached"]
                elif kind == "done":
                    result.cached = event.get("cached") or result.cached
                    result.finish_reason = event.get("finish_reason")
                    usage = event.get("usage") or {}
                    clock.end(None, usage.get("completion_tokens"), usage.get("prompt_tokens"))
                    ended = True
                    return clock.text
                elif kind == "error":
                    clock.end(event.get("code") or "error")
                    ended = True
                    return clock.text
        except ConnectionClosed:
            clock.end(lane.closing_error or "connection_closed")
            ended = True
            return clock.text
        finally:
            lane.waiting.pop(rid, None)
            if not ended and lane.open:  # the run's hard timeout cut it short: the server may stop too
                try:
                    await asyncio.shield(lane.ws.send(json.dumps({"type": "cancel", "id": rid})))
                except (ConnectionClosed, asyncio.CancelledError):
                    pass

    async def close(self) -> None:
        for lane in self.lanes:
            await lane.ws.close()
            lane.reader.cancel()


async def gateway_workers(http_base: str) -> int | None:
    """How many workers a Brigade gateway sees (its /readyz); None from another server."""
    try:
        async with httpx.AsyncClient(timeout=5) as client:
            workers = (await client.get(http_base + "/readyz")).json().get("workers")
            return int(workers) if workers is not None else None
    except (httpx.HTTPError, ValueError, AttributeError, TypeError):
        return None
