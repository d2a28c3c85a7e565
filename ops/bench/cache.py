"""`brigade bench cache`: cache hit latency end to end over a WebSocket, and lookup cost by size.

- hits: against a running gateway (settings.ws_url). One question is answered by a worker (a
  miss), then asked again N times (exact hits). Then QQP duplicate pairs: each q1 is stored
  through the cache code with a made-up answer, each q2 is asked over the WebSocket; the
  latency of those answered as semantic hits is reported.
- lookup: FAISS search time in one namespace at 1k, 10k and 100k entries, flat against HNSW.
"""
from __future__ import annotations

import asyncio
import json
import statistics
import time

import numpy as np
from websockets.asyncio.client import connect

from cache.answer_cache import AnswerCache
from cache.index import Item, VectorIndex
from cache.query import PromptRenderer, make_query
from ops.core.messages import ChatMessage, GenerateParams
from ops.core.settings import Settings
from ops.training.pair_model.pairs import read_pairs


def _pct(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(round(q * (len(values) - 1))))]


def summary(ms: list[float]) -> dict:
    if not ms:
        return {"n": 0}
    return {"n": len(ms), "p50_ms": round(statistics.median(ms), 3), "p99_ms": round(_pct(ms, 0.99), 3),
            "mean_ms": round(statistics.fmean(ms), 3)}


async def _timed(ws, message: dict) -> tuple[float, dict]:
    started = time.perf_counter()
    await ws.send(json.dumps(message))
    while True:
        event = json.loads(await ws.recv())
        if event.get("id") == message["id"] and event["type"] in ("done", "error"):
            return (time.perf_counter() - started) * 1000, event


async def hit_latency(settings: Settings, repeats: int, pairs_file: str, semantic_pairs: int, url: str | None = None,
                      api_key: str | None = None) -> dict:
    question = "What is the capital of France?"
    # Greedy, as the cache stores only deterministic answers (a sampled default is not stored).
    base = {"type": "generate", "max_tokens": 32, "temperature": 0, "messages": [{"role": "user", "content": question}]}
    out = {}
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else None
    async with connect(url or settings.ws_url, additional_headers=headers, max_size=None) as ws:
        miss_ms, first = await _timed(ws, {**base, "id": "miss"})
        await asyncio.sleep(0.2)  # the answer is stored after `done`
        exact = []
        for i in range(repeats):
            ms, event = await _timed(ws, {**base, "id": f"exact-{i}"})
            if event.get("cached") == "exact":
                exact.append(ms)
        out["miss_ms"] = round(miss_ms, 1)
        out["exact_hit"] = summary(exact)

        cache = AnswerCache(settings)
        renderer = PromptRenderer(settings.model_dir)
        params = GenerateParams(max_tokens=32, temperature=0.0, top_p=1.0, top_k=0, repetition_penalty=1.0)
        duplicates = [p for p in read_pairs(pairs_file) if p.duplicate][-semantic_pairs:]
        for p in duplicates:
            q = make_query(renderer, settings.model_name, None, [ChatMessage(role="user", content=p.q1)], params)
            await cache.insert(q, None, ["(bench answer)"], "stop", 0, 3)
        await asyncio.sleep(0.5)  # the gateway's index follows the log
        semantic, misses = [], 0
        for i, p in enumerate(duplicates):
            ms, event = await _timed(ws, {**base, "id": f"sem-{i}", "messages": [{"role": "user", "content": p.q2}]})
            if event.get("cached") == "semantic":
                semantic.append(ms)
            else:
                misses += 1
        out["semantic_hit"] = summary(semantic)
        out["semantic_pairs_asked"] = len(duplicates)
    return out


def lookup_cost(sizes: list[int], queries: int = 200, dim: int = 384, seed: int = 0) -> list[dict]:
    rng = np.random.default_rng(seed)
    rows = []
    for size in sizes:
        vectors = rng.standard_normal((size, dim)).astype(np.float32)
        vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
        probes = vectors[rng.integers(0, size, queries)] + 0.05 * rng.standard_normal((queries, dim)).astype(np.float32)
        probes /= np.linalg.norm(probes, axis=1, keepdims=True)
        row = {"entries": size}
        for kind, hnsw_from in (("flat", size + 1), ("hnsw", 0)):
            index = VectorIndex(dim, hnsw_from=hnsw_from)
            started = time.perf_counter()
            for i in range(size):
                index.add(str(i), Item(vectors[i], ""))
            build = time.perf_counter() - started
            times = []
            for q in probes:
                t = time.perf_counter()
                index.search(q, 4)
                times.append((time.perf_counter() - t) * 1000)
            row[kind] = {"build_s": round(build, 2), **summary(times)}
        rows.append(row)
    return rows


def run(settings: Settings, repeats: int, pairs_file: str, semantic_pairs: int, sizes: list[int],
        url: str | None = None, api_key: str | None = None) -> dict:
    """url: the gateway's WebSocket (default settings.ws_url); the entries go to settings.cache_redis."""
    report = {"lookup_cost": lookup_cost(sizes) if sizes else []}
    report["hits"] = asyncio.run(hit_latency(settings, repeats, pairs_file, semantic_pairs, url, api_key))
    return report
