"""`brigade chat`: ask the gateway over a WebSocket and print tokens as they arrive.

The conversation lives here, on the client, so a dropped connection costs nothing: it is opened
again, and an answer cut mid-stream is resumed from its replay log. Waiting for the user's next
line never blocks the event loop (stdin is one more thing the loop watches), so the connection
answers keepalive pings however long the user thinks. Ctrl-C is an event, not a traceback:
during an answer it cancels that request, at the prompt it ends the session.
"""
from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
import time
import uuid
from dataclasses import dataclass

from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed, InvalidHandshake, InvalidStatus

from ops.core.redaction import redact_url

# Exit codes: an answer or a session that ended well, a failed answer, Ctrl-C (as shells count it).
OK, FAILED, INTERRUPTED = 0, 1, 130


@dataclass(frozen=True)
class ChatOptions:
    url: str
    # None: not sent, so the served model's defaults apply (the gateway knows them; a CLI that
    # sent its own would be wrong for every other model). --temperature 0 asks greedily.
    max_tokens: int | None = None
    temperature: float | None = None
    seed: int | None = None
    system: str | None = None
    cache: str = "auto"
    api_key: str | None = None
    max_message_bytes: int = 16 * 1024 * 1024
    # A connection that drops is opened again for this long (a gateway restarting, a network
    # blip) before the question is given up; the first connection is tried once.
    reconnect_s: float = 30.0
    # After Ctrl-C, how long to wait for the gateway to confirm the cancel before moving on.
    cancel_wait_s: float = 5.0

    def generate(self, client_id: str, messages: list[dict]) -> dict:
        frame = {"type": "generate", "id": client_id, "messages": messages, "cache": self.cache}
        if self.max_tokens is not None:
            frame["max_tokens"] = self.max_tokens
        if self.temperature is not None:
            frame["temperature"] = self.temperature
        if self.seed is not None:
            frame["seed"] = self.seed
        return frame

    def first_messages(self) -> list[dict]:
        return [{"role": "system", "content": self.system}] if self.system else []


class GatewayUnreachable(Exception):
    """No connection to the gateway could be opened, or none stays open."""


class GatewayRefused(GatewayUnreachable):
    """The gateway turned this client away (no API key, a wrong one): asking again cannot help."""

    @classmethod
    def from_event(cls, event: dict) -> GatewayRefused:
        hint = " (give --api-key or set BRIGADE_API_KEY)" if event.get("code") == "unauthorized" else ""
        return cls(f"error {event.get('code')}: {event.get('message')}{hint}")


class CtrlC:
    """SIGINT as an event the chat waits on beside its work, instead of a KeyboardInterrupt."""

    PRESSED = object()

    def __init__(self):
        self._event = asyncio.Event()

    def __enter__(self) -> CtrlC:
        asyncio.get_running_loop().add_signal_handler(signal.SIGINT, self._event.set)
        return self

    def __exit__(self, *_) -> None:
        asyncio.get_running_loop().remove_signal_handler(signal.SIGINT)

    async def race(self, awaitable, timeout: float | None = None):
        """The result of `awaitable`, or PRESSED if Ctrl-C came first (the awaitable is then
        cancelled, so it must be cancel-safe); TimeoutError if neither came within `timeout`."""
        work = asyncio.ensure_future(awaitable)
        if not self._event.is_set():
            pressed = asyncio.ensure_future(self._event.wait())
            await asyncio.wait({work, pressed}, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
            pressed.cancel()
        if work.done():
            return work.result()
        work.cancel()
        if self._event.is_set():
            self._event.clear()
            return self.PRESSED
        raise TimeoutError


class StdinLines:
    """Lines from stdin, read by the event loop when stdin is a terminal or a pipe; a file or
    /dev/null never blocks, so it is read in place."""

    def __init__(self):
        self._loop = asyncio.get_running_loop()
        self._lines: asyncio.Queue[str | None] = asyncio.Queue()
        self._pending = b""
        self._eof = sys.stdin is None
        self._watched = False
        if not self._eof:
            try:
                self._fd = sys.stdin.fileno()
                self._loop.add_reader(self._fd, self._readable)
                self._watched = True
            except OSError:  # epoll takes no regular file (PermissionError), nor a stdin without fd
                pass

    def close(self) -> None:
        if self._watched:
            self._loop.remove_reader(self._fd)
            self._watched = False

    async def readline(self) -> str | None:
        """The next line without its newline, or None at end of input."""
        if not self._watched and self._lines.empty():
            if self._eof:
                return None
            line = sys.stdin.readline()
            return line.rstrip("\r\n") if line else None
        if self._eof and self._lines.empty():
            return None
        return await self._lines.get()

    def _readable(self) -> None:
        chunk = os.read(self._fd, 65536)
        if not chunk:
            self.close()
            if self._pending:
                self._lines.put_nowait(self._pending.decode("utf-8", "replace"))
            self._eof = True
            self._lines.put_nowait(None)
            return
        *lines, self._pending = (self._pending + chunk).split(b"\n")
        for line in lines:
            self._lines.put_nowait(line.decode("utf-8", "replace").rstrip("\r"))


class GatewayLink:
    """One WebSocket to the gateway, opened again when it drops."""

    def __init__(self, options: ChatOptions):
        self.options = options
        self.ws: ClientConnection | None = None

    async def open(self, retry: bool) -> None:
        o = self.options
        headers = {"Authorization": f"Bearer {o.api_key}"} if o.api_key else None
        deadline = time.monotonic() + (o.reconnect_s if retry else 0)
        delay = 0.25
        while True:
            try:
                # websockets' own keepalive (a ping every 20 s) runs as long as the loop does.
                self.ws = await connect(o.url, additional_headers=headers, max_size=o.max_message_bytes)
                return
            except InvalidStatus as exc:
                status = exc.response.status_code
                hint = " (give --api-key or set BRIGADE_API_KEY)" if status == 401 else ""
                raise GatewayRefused(f"the gateway at {redact_url(o.url)} refused the connection: HTTP {status}{hint}") from None
            except (OSError, InvalidHandshake, TimeoutError) as exc:
                if time.monotonic() + delay > deadline:
                    raise GatewayUnreachable(f"cannot reach the gateway at {redact_url(o.url)}: {exc or type(exc).__name__} "
                                             "(is `brigade up` running?)") from None
            await asyncio.sleep(delay)
            delay = min(delay * 2, 2.0)

    async def send(self, frame: dict, reopen: bool = True) -> None:
        """Send, opening the connection again first if it is gone; without `reopen`, a frame for
        a connection that is gone is dropped (the reader learns of the loss and resumes)."""
        for _ in range(3):
            try:
                await self.ws.send(json.dumps(frame))
                return
            except ConnectionClosed:
                if not reopen:
                    return
                await self._why_closed()
                await self.open(retry=True)
        raise GatewayUnreachable(f"the gateway at {self.options.url} keeps closing the connection")

    async def _why_closed(self) -> None:
        """Read what the gateway said before it closed; GatewayRefused if it turned us away."""
        try:
            while True:
                event = json.loads(await self.ws.recv())
                if event.get("type") == "error" and event.get("id") is None:
                    raise GatewayRefused.from_event(event)
        except ConnectionClosed:
            return

    async def recv(self) -> dict:
        return json.loads(await self.ws.recv())

    async def close(self) -> None:
        if self.ws is not None:
            await self.ws.close()


@dataclass
class Reply:
    """One answer as it arrives, and what a resume of it needs."""

    client_id: str
    text: str = ""
    end: dict | None = None  # the done event; None when the answer failed or was given up
    cancelled: bool = False
    printed: bool = False  # tokens went to stdout (so a newline ends them)
    request_id: str | None = None  # the server's id, from the queued event: what a resume names
    resumed: bool = False  # on a later connection, where its events carry the request_id as id
    last_index: int = -1

    @property
    def live_id(self) -> str:
        return self.request_id if self.resumed else self.client_id

    @property
    def answered(self) -> bool:
        return self.end is not None and self.end.get("finish_reason") in ("stop", "length", "repetition")


async def ask(link: GatewayLink, messages: list[dict], ctrl_c: CtrlC) -> Reply:
    """Ask once and print the answer as it streams; Ctrl-C cancels the request."""
    reply = Reply(uuid.uuid4().hex[:12])
    frame = link.options.generate(reply.client_id, messages)
    cancel_by: float | None = None  # set once Ctrl-C sent a cancel: how long its confirmation may take
    try:
        if await ctrl_c.race(link.send(frame)) is CtrlC.PRESSED:
            reply.cancelled = True
            return reply
        while reply.end is None:
            try:
                timeout = None if cancel_by is None else max(0.0, cancel_by - time.monotonic())
                event = await ctrl_c.race(link.recv(), timeout)
            except ConnectionClosed:
                if not await _carry_on(link, reply, frame, cancel_by is not None, ctrl_c):
                    return reply
                continue
            except TimeoutError:
                return reply  # the cancel was sent; the gateway did not confirm it in time
            if event is CtrlC.PRESSED:
                if cancel_by is not None:  # Ctrl-C again: stop waiting for the confirmation
                    return reply
                reply.cancelled = True
                cancel_by = time.monotonic() + link.options.cancel_wait_s
                await link.send({"type": "cancel", "id": reply.live_id}, reopen=False)
            elif not _absorb(reply, event):
                return reply
        reply.cancelled = reply.end.get("finish_reason") == "cancelled"
        return reply
    finally:
        if reply.printed:
            print(flush=True)
        if reply.cancelled:
            _note("cancelled")
        elif reply.end is not None:
            _note(summary(reply.end))


async def _carry_on(link: GatewayLink, reply: Reply, frame: dict, cancelling: bool, ctrl_c: CtrlC) -> bool:
    """The connection dropped mid-answer: go on over a new one. A queued request is resumed after
    its last token received; one not queued yet produced nothing, so it is simply sent again.
    False when there is nothing to go on with."""
    if reply.request_id is None and (cancelling or reply.printed):
        if not cancelling:
            _error("the connection dropped before the answer was queued; ask again")
        return False
    _note("connection lost; reconnecting")
    again = {"type": "resume", "id": reply.request_id, "after_index": reply.last_index} if reply.request_id else frame
    if await ctrl_c.race(link.send(again)) is CtrlC.PRESSED:
        reply.cancelled = True
        return False
    reply.resumed = reply.request_id is not None
    if cancelling:
        await link.send({"type": "cancel", "id": reply.live_id}, reopen=False)
    return True


def _absorb(reply: Reply, event: dict) -> bool:
    """Take one event (printing tokens); False when it ended the answer without a done event."""
    if event.get("id") not in (None, reply.client_id, reply.request_id):
        return True  # another request's, or of a connection before
    kind = event.get("type")
    if kind == "queued":
        reply.request_id = event["request_id"]
    elif kind == "token" and event["index"] > reply.last_index:
        reply.last_index = event["index"]
        reply.text += event["text"]
        reply.printed = True
        print(event["text"], end="", flush=True)
    elif kind == "done":
        reply.end = event
    elif kind == "error":
        if reply.printed:
            print(flush=True)
            reply.printed = False
        if event.get("code") == "unauthorized":
            raise GatewayRefused.from_event(event)
        _error(f"error {event.get('code')}: {event.get('message')}")
        return False
    return True


def summary(done: dict) -> str:
    """One line about an answer: where it came from, how fast, how long."""
    timing, usage = done.get("timing") or {}, done.get("usage") or {}
    parts = [f"cached ({done['cached']})" if done.get("cached") else "not cached"]
    if timing.get("ttft_s") is not None:
        parts.append(f"first token {_seconds(timing['ttft_s'])}")
    if timing.get("e2e_s") is not None:
        parts.append(f"total {_seconds(timing['e2e_s'])}")
    if usage.get("completion_tokens") is not None:
        parts.append(f"{usage['completion_tokens']} tokens")
    if usage.get("prompt_tokens") is not None:
        parts.append(f"{usage['prompt_tokens']} prompt tokens")
    if done.get("finish_reason") == "length":
        parts.append("cut at --max-tokens")
    elif done.get("finish_reason") == "repetition":
        parts.append("ended: it had begun to repeat itself")
    return ", ".join(parts)


def _seconds(s: float) -> str:
    return f"{s * 1000:.0f} ms" if s < 0.1 else f"{s:.2f} s"


def _note(text: str) -> None:
    """A dim line on stderr: about the answer, not part of it."""
    dim = sys.stderr.isatty()
    print(f"\033[2m[{text}]\033[0m" if dim else f"[{text}]", file=sys.stderr, flush=True)


def _error(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


async def chat(options: ChatOptions, question: str | None) -> int:
    """One question (exit status: answered or not), or an interactive session until EOF or Ctrl-C."""
    link = GatewayLink(options)
    with CtrlC() as ctrl_c:
        try:
            if await ctrl_c.race(link.open(retry=False)) is CtrlC.PRESSED:
                return INTERRUPTED
            if question is not None:
                reply = await ask(link, options.first_messages() + [{"role": "user", "content": question}], ctrl_c)
                return INTERRUPTED if reply.cancelled else OK if reply.answered else FAILED
            return await _session(link, options, ctrl_c)
        except GatewayUnreachable as exc:
            _error(str(exc))
            return FAILED
        finally:
            await link.close()


async def _session(link: GatewayLink, options: ChatOptions, ctrl_c: CtrlC) -> int:
    history = options.first_messages()
    lines = StdinLines()
    prompt = "> " if sys.stdin is not None and sys.stdin.isatty() else ""
    try:
        while True:
            print(prompt, end="", flush=True)
            line = await ctrl_c.race(lines.readline())
            if line is CtrlC.PRESSED:
                if prompt:
                    print(flush=True)  # the shell's prompt starts on a line of its own
                return INTERRUPTED
            if line is None:
                if prompt:
                    print(flush=True)
                return OK
            if not line.strip():
                continue
            try:
                reply = await ask(link, history + [{"role": "user", "content": line}], ctrl_c)
            except GatewayRefused:
                raise
            except GatewayUnreachable as exc:
                _error(f"{exc}; the conversation is kept, ask again")
                continue
            # Only whole exchanges join the history: an empty, failed or cancelled answer would
            # leave a question without its answer (and blank content is refused).
            if reply.answered and reply.text.strip():
                history += [{"role": "user", "content": line}, {"role": "assistant", "content": reply.text}]
    finally:
        lines.close()
