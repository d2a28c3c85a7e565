"""What `brigade bench serve` puts on the wire, read by the server it talks to: a small recording
server (OpenAI's SSE route and Brigade's WebSocket, on a real port under uvicorn) stands in for
the gateway, so the fields are checked whatever the gateway of the day accepts. The command runs
as a user runs it, a subprocess; its load against real gateways is tests/test_bench_serve.py's."""
from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, StreamingResponse
from starlette.routing import Route, WebSocketRoute
from starlette.websockets import WebSocket, WebSocketDisconnect

from tests.services import free_port, wait_until

ROOT = Path(__file__).resolve().parent.parent


class RecordingServer:
    """Answers each request with `max_tokens` one-word pieces when it asks to ignore EOS, else one
    piece and `stop` (what a model that ends early does); keeps every body and frame it got."""

    def __init__(self):
        self.received: list[dict] = []
        self.port = free_port()
        app = Starlette(routes=[Route("/v1/models", self.models), Route("/readyz", self.readyz),
                                Route("/v1/chat/completions", self.chat, methods=["POST"]),
                                WebSocketRoute("/v1/ws", self.ws)])
        self.server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="warning"))
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    @staticmethod
    def pieces(body: dict) -> tuple[int, str]:
        return (body.get("max_tokens") or 1, "length") if body.get("ignore_eos") else (1, "stop")

    async def models(self, request: Request) -> JSONResponse:
        return JSONResponse({"object": "list", "data": [{"id": "recorded", "object": "model"}]})

    async def readyz(self, request: Request) -> JSONResponse:
        return JSONResponse({"ready": True, "workers": 1})

    async def chat(self, request: Request) -> StreamingResponse:
        body = await request.json()
        self.received.append(body)
        n, finish = self.pieces(body)

        async def events():
            for i in range(n):
                yield f"data: {json.dumps({'choices': [{'index': 0, 'delta': {'content': 'w '}}]})}\n\n"
            yield f"data: {json.dumps({'choices': [{'index': 0, 'delta': {}, 'finish_reason': finish}]})}\n\n"
            yield f"data: {json.dumps({'choices': [], 'usage': {'completion_tokens': n}})}\n\n"
            yield "data: [DONE]\n\n"

        return StreamingResponse(events(), media_type="text/event-stream")

    async def ws(self, websocket: WebSocket) -> None:
        await websocket.accept()
        try:
            while True:
                frame = json.loads(await websocket.receive_text())
                self.received.append(frame)
                n, finish = self.pieces(frame)
                for i in range(n):
                    token = {"type": "token", "id": frame["id"], "index": i, "text": "w "}
                    await websocket.send_text(json.dumps(token))
                    await asyncio.sleep(0)
                await websocket.send_text(json.dumps({"type": "done", "id": frame["id"], "finish_reason": finish,
                                                      "usage": {"completion_tokens": n}}))
        except WebSocketDisconnect:
            pass

    def __enter__(self) -> "RecordingServer":
        self.thread.start()
        wait_until(lambda: self.server.started, 10, what="the recording server")
        return self

    def __exit__(self, *exc) -> None:
        self.server.should_exit = True
        self.thread.join(10)


@pytest.fixture(scope="module")
def recorder():
    with RecordingServer() as server:
        yield server


def _bench(recorder: RecordingServer, backend: str, out: Path, *flags: str) -> tuple[list[dict], dict]:
    recorder.received.clear()
    done = subprocess.run([sys.executable, "-m", "ops.commands.cli", "bench", "serve", "--url",
                           f"http://127.0.0.1:{recorder.port}", "--backend", backend, "--num-requests", "3",
                           "--max-tokens", "5", "--json", str(out), *flags],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    return list(recorder.received), json.loads(out.read_text())


@pytest.mark.parametrize("backend", ["openai", "ws"])
def test_ignore_eos_rides_on_every_request_and_the_report_says_so(recorder, backend, tmp_path):
    sent, report = _bench(recorder, backend, tmp_path / "on.json", "--ignore-eos")
    assert len(sent) == 3 and all(r.get("ignore_eos") is True and r["max_tokens"] == 5 for r in sent), sent
    assert report["config"]["ignore_eos"] is True
    assert [row["output_tokens"] for row in report["per_request"]] == [5, 5, 5]
    if backend == "ws":
        assert all(r["type"] == "generate" for r in sent)
    else:
        assert all(r["stream"] is True and r["model"] == "recorded" for r in sent)


@pytest.mark.parametrize("backend", ["openai", "ws"])
def test_without_the_flag_no_request_carries_the_field(recorder, backend, tmp_path):
    sent, report = _bench(recorder, backend, tmp_path / "off.json")
    assert len(sent) == 3 and not any("ignore_eos" in r for r in sent), sent
    assert report["config"]["ignore_eos"] is False
    assert [row["output_tokens"] for row in report["per_request"]] == [1, 1, 1]
