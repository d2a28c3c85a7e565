"""`brigade bench doors`: the same requests through the WebSocket and the OpenAI HTTP door, side by side.

Against a running gateway. Each round sends one greedy, uncached request through each door in
turn (the order alternates between rounds, so neither door always meets a warmer engine), and
times the first token and the end as the client sees them. Reports medians per door and the
HTTP/WebSocket ratio of the time to first token.
"""
from __future__ import annotations

import asyncio
import json
import statistics
import time
import uuid

import httpx
from websockets.asyncio.client import connect

from ops.core.redaction import redact_url
from ops.core.settings import GatewaySettings, Settings

QUESTIONS = [
    "What is the capital of France?", "List three colors.", "Name a fruit.", "What is 2 + 2?",
    "Say hello in Spanish.", "Name a planet.", "What color is the sky?", "Name an animal.",
]


async def _ws_once(url: str, question: str, max_tokens: int, headers: dict) -> tuple[float, float]:
    async with connect(url, additional_headers=headers, max_size=None) as ws:
        rid = uuid.uuid4().hex[:8]
        start = time.perf_counter()
        await ws.send(json.dumps({"type": "generate", "id": rid, "messages": [{"role": "user", "content": question}],
                                  "max_tokens": max_tokens, "temperature": 0, "cache": "off"}))
        first = None
        while True:
            event = json.loads(await ws.recv())
            if event["type"] == "token" and first is None:
                first = time.perf_counter() - start
            if event["type"] in ("done", "error"):
                if event["type"] == "error":
                    raise RuntimeError(f"websocket: {event}")
                return first, time.perf_counter() - start


async def _http_once(client: httpx.AsyncClient, url: str, question: str, max_tokens: int,
                     headers: dict) -> tuple[float, float]:
    body = {"messages": [{"role": "user", "content": question}], "max_tokens": max_tokens, "temperature": 0,
            "stream": True, "cache": "off"}
    start = time.perf_counter()
    first = None
    async with client.stream("POST", url, json=body, headers=headers) as r:
        if r.status_code != 200:
            raise RuntimeError(f"http: {r.status_code} {(await r.aread())[:200]!r}")
        async for line in r.aiter_lines():
            if first is None and line.startswith("data: {") and '"content"' in line:
                first = time.perf_counter() - start
    return first, time.perf_counter() - start


async def _run(settings: GatewaySettings, base: str | None, rounds: int, max_tokens: int, api_key: str | None) -> dict:
    http_base = base or settings.http_url
    ws_url = http_base.replace("http", "ws", 1) + "/v1/ws"
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    times: dict[str, list[tuple[float, float]]] = {"ws": [], "http": []}
    async with httpx.AsyncClient(timeout=300) as client:
        for i in range(rounds):
            question = QUESTIONS[i % len(QUESTIONS)]
            order = ("ws", "http") if i % 2 == 0 else ("http", "ws")
            for door in order:
                if door == "ws":
                    times["ws"].append(await _ws_once(ws_url, question, max_tokens, headers))
                else:
                    times["http"].append(await _http_once(client, http_base + "/v1/chat/completions", question,
                                                          max_tokens, headers))

    def summary(rows):
        return {"ttft_p50_s": round(statistics.median(r[0] for r in rows), 4),
                "e2e_p50_s": round(statistics.median(r[1] for r in rows), 4), "requests": len(rows)}

    report = {"target": "doors", "url": redact_url(http_base), "rounds": rounds, "max_tokens": max_tokens,
              "ws": summary(times["ws"]), "http_sse": summary(times["http"])}
    report["http_over_ws_ttft_ratio"] = round(report["http_sse"]["ttft_p50_s"] / report["ws"]["ttft_p50_s"], 3)
    report["http_minus_ws_ttft_p50_ms"] = round(
        (report["http_sse"]["ttft_p50_s"] - report["ws"]["ttft_p50_s"]) * 1000, 1)
    return report


def run(settings: Settings, url: str | None, rounds: int, max_tokens: int, api_key: str | None) -> dict:
    return asyncio.run(_run(settings, url, rounds, max_tokens, api_key))
