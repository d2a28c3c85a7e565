"""`brigade bench cache-replay`: the answer cache measured live, through a running gateway.

Against a running service (its WebSocket), from labelled question pairs:
1. Fill: every distinct q1 (a source) is asked once with `cache: exact` (so that each gets its
   own answer, never a neighbour's) and answered by a worker; its answer text is remembered.
2. Wait: the gateway stores an answer after its `done`, in the background. Each source is asked
   again until it comes back as an exact hit (a probe that would run is cancelled at once, before
   a worker spends anything on it), within --store-timeout.
3. Replay: exact repeats, rewordings and look-alikes, shuffled (cache_replay_judge.plan_replay),
   --concurrency at a time, with the default `cache: auto`.
Every hit is then judged right or wrong by the text it served (cache_replay_judge), and the report
gives hit rate, rewording recall, look-alikes served, wrong hits, the compute saved and hit
against miss latency, all from the replay.

With --rounds N the sources are dealt into N rounds, each filled and replayed in turn, and after
each one the cache's evidence is read (`brigade cache stats`' `evidence`, once the audits it queued
have settled): the audited wrong-hit rate with its interval, and the thresholds the evidence moved
the cache to, round by round, against the trained ones.
"""
from __future__ import annotations

import asyncio
import json
import math
import random
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed, InvalidHandshake

from ops.bench.cache_replay_judge import Ask, Reply, judge, plan_replay, sources_of, summarize
from ops.bench.serve_backends import REQUESTS_PER_CONNECTION, CannotReach, WebSocketLane
from ops.core.redaction import redact_url
from ops.training.pair_model.pairs import Pair

DEFAULT_PAIRS = "chat_paraphrases.jsonl"  # in ops/data/


def default_pairs_path() -> Path:
    return Path(str(resources.files("ops") / "data" / DEFAULT_PAIRS))


@dataclass(frozen=True)
class ReplayConfig:
    url: str  # the gateway's WebSocket
    pairs: str | None  # the pair file; None: the shipped one
    limit: int | None = None
    repeat_ratio: float = 0.3
    seed: int = 0
    concurrency: int = 8
    max_tokens: int = 48
    temperature: float = 0.0
    cache_threshold: float | None = None  # sent as each replayed request's `cache_threshold`
    store_timeout_s: float = 60.0
    api_key: str | None = None
    rounds: int = 1

    def to_json(self) -> dict:
        return {"url": redact_url(self.url), "pairs": self.pairs or f"shipped:{DEFAULT_PAIRS}", "limit": self.limit,
                "repeat_ratio": self.repeat_ratio, "seed": self.seed, "concurrency": self.concurrency,
                "max_tokens": self.max_tokens, "temperature": self.temperature,
                "cache_threshold": self.cache_threshold, "store_timeout_s": self.store_timeout_s,
                "rounds": self.rounds}


class Gateway:
    """WebSocket lanes to one gateway (serve_backends.WebSocketLane), each carrying at most
    REQUESTS_PER_CONNECTION requests; asks a question and collects the whole reply."""

    def __init__(self, config: ReplayConfig):
        self.config = config
        self.headers = {"Authorization": f"Bearer {config.api_key}"} if config.api_key else {}
        self.lanes: list[WebSocketLane] = []
        self.run_id = uuid.uuid4().hex[:6]

    async def open(self) -> None:
        try:
            for _ in range(math.ceil(self.config.concurrency / REQUESTS_PER_CONNECTION)):
                ws = await connect(self.config.url, additional_headers=self.headers, max_size=None, open_timeout=10)
                self.lanes.append(WebSocketLane(ws))
        except (OSError, InvalidHandshake, asyncio.TimeoutError) as exc:  # refused, or a handshake refused (401)
            await self.close()
            raise CannotReach(f"{redact_url(self.config.url)} does not answer: {exc!r}") from None

    async def close(self) -> None:
        for lane in self.lanes:
            await lane.ws.close()
            lane.reader.cancel()

    def frame(self, rid: str, question: str, cache: str) -> dict:
        frame = {"type": "generate", "id": rid, "messages": [{"role": "user", "content": question}],
                 "max_tokens": self.config.max_tokens, "temperature": self.config.temperature, "cache": cache}
        if self.config.cache_threshold is not None and cache == "auto":
            frame["cache_threshold"] = self.config.cache_threshold
        return frame

    async def ask(self, slot: int, rid: str, question: str, cache: str = "auto", hits_only: bool = False) -> Reply:
        """One question, its reply read to the end. `hits_only`: a request that is queued (not a
        hit) is cancelled at once and comes back as the error `not_cached`."""
        lane = self.lanes[slot % len(self.lanes)]
        queue: asyncio.Queue = asyncio.Queue()
        lane.waiting[rid] = queue
        reply, pieces = Reply(), []
        started = time.perf_counter()
        try:
            await lane.ws.send(json.dumps(self.frame(rid, question, cache)))
            while True:
                event = await queue.get()
                kind = event.get("type")
                if kind == "queued" and hits_only:
                    await lane.ws.send(json.dumps({"type": "cancel", "id": rid}))
                    reply.error = "not_cached"
                elif kind == "token":
                    if event.get("text") and reply.ttft_s is None:
                        reply.ttft_s = time.perf_counter() - started
                    pieces.append(event.get("text") or "")
                elif kind == "done":
                    reply.e2e_s = time.perf_counter() - started
                    reply.cached, reply.similarity = event.get("cached") or None, event.get("similarity")
                    reply.entry, reply.finish_reason = event.get("entry"), event.get("finish_reason")
                    reply.completion_tokens = int((event.get("usage") or {}).get("completion_tokens") or 0)
                    if reply.finish_reason == "cancelled" and reply.error is None:
                        reply.error = "cancelled"
                    break
                elif kind == "error":
                    reply.e2e_s = time.perf_counter() - started
                    reply.error = reply.error or event.get("code") or "error"
                    break
        except ConnectionClosed:
            reply.error = lane.closing_error or "connection_closed"
        finally:
            lane.waiting.pop(rid, None)
        reply.text = "".join(pieces)
        return reply


async def _each(items: list, concurrency: int, work) -> list:
    """work(slot, item) for every item, `concurrency` at a time; results in the items' order."""
    results: list = [None] * len(items)
    pending = iter(enumerate(items))

    async def runner(slot: int) -> None:
        for i, item in pending:
            results[i] = await work(slot, item)

    await asyncio.gather(*(runner(slot) for slot in range(concurrency)))
    return results


async def wait_stored(gateway: Gateway, sources: list[str], timeout_s: float) -> list[str]:
    """Ask each source until it is an exact hit (its answer stored), within `timeout_s`; the sources
    still not stored at the deadline are returned."""
    deadline = time.monotonic() + timeout_s

    async def until_stored(slot: int, item: tuple[int, str]) -> str | None:
        number, source = item
        pause, attempt = 0.02, 0
        while True:
            rid = f"{gateway.run_id}-stored-{number}-{attempt}"
            if (await gateway.ask(slot, rid, source, "exact", hits_only=True)).cached == "exact":
                return None
            if time.monotonic() + pause > deadline:
                return source
            await asyncio.sleep(pause)  # the store is a background task of a few milliseconds
            pause, attempt = min(pause * 2, 0.5), attempt + 1

    missing = await _each(list(enumerate(sources)), gateway.config.concurrency, until_stored)
    return [s for s in missing if s is not None]


async def _round(gateway: Gateway, config: ReplayConfig, pairs: list[Pair], tag: str) -> tuple[dict, list]:
    """Fill, wait for the stores, replay: one round's fill report and its judged replies."""
    asks = plan_replay(pairs, config.repeat_ratio, config.seed)
    sources = sources_of(pairs)
    started = time.perf_counter()
    fill_replies = await _each(list(enumerate(sources)), config.concurrency, lambda slot, item: gateway.ask(
        slot, f"{gateway.run_id}{tag}-fill-{item[0]}", item[1], "exact"))
    fill = dict(zip(sources, fill_replies))
    fill_s = time.perf_counter() - started
    answered = [s for s in sources if fill[s].ok]
    started = time.perf_counter()
    not_stored = await wait_stored(gateway, answered, config.store_timeout_s)
    wait_s = time.perf_counter() - started

    async def ask(slot: int, a: Ask) -> Reply:
        return await gateway.ask(slot, f"{gateway.run_id}{tag}-{a.index}", a.question)

    started = time.perf_counter()
    replies = await _each(asks, config.concurrency, ask)
    replay_s = time.perf_counter() - started
    fill_errors: dict[str, int] = {}
    for s in sources:
        if not fill[s].ok:
            fill_errors[fill[s].error] = fill_errors.get(fill[s].error, 0) + 1
    report = {"fill": {"sources": len(sources), "answered": len(answered), "stored": len(answered) - len(not_stored),
                       "already_cached": sum(fill[s].cached is not None for s in answered), "errors": fill_errors,
                       "not_stored": not_stored, "duration_s": round(fill_s, 3), "wait_stored_s": round(wait_s, 3)},
              "replay_duration_s": round(replay_s, 3)}
    return report, judge(fill, list(zip(asks, replies)))


def dealt(pairs: list[Pair], rounds: int, seed: int) -> list[list[Pair]]:
    """The pairs in `rounds` rounds, each source's pairs whole in one (sources dealt at random by `seed`)."""
    sources = sources_of(pairs)
    random.Random(seed).shuffle(sources)
    round_of = {s: i % rounds for i, s in enumerate(sources)}
    return [[p for p in pairs if round_of[p.q1] == i] for i in range(rounds)]


async def replay(config: ReplayConfig, pairs: list[Pair],
                 evidence: Callable[[], Awaitable[dict]] | None = None) -> dict:
    """The report (module docstring); `evidence` reads the cache's evidence after each round."""
    gateway = Gateway(config)
    await gateway.open()
    rounds, judged_all = [], []
    try:
        before = await evidence() if evidence is not None else None
        for number, part in enumerate(dealt(pairs, config.rounds, config.seed) if config.rounds > 1 else [pairs]):
            report, judged = await _round(gateway, config, part, f"-r{number}" if config.rounds > 1 else "")
            judged_all += judged
            if config.rounds > 1:
                report = {"round": number + 1, **report, **summarize(judged)}
            if evidence is not None:
                report["evidence"] = await evidence()
            rounds.append(report)
    finally:
        await gateway.close()
    out = {"target": "cache-replay", "config": config.to_json()}
    if config.rounds > 1:
        out["rounds"] = rounds
    else:
        out.update(rounds[0])
    if before is not None:
        out["evidence_before"] = before
    return {**out, **summarize(judged_all), "per_request": [j.to_json() for j in judged_all]}


def run(config: ReplayConfig, pairs: list[Pair], evidence: Callable[[], Awaitable[dict]] | None = None) -> dict:
    """The report (module docstring); raises CannotReach when the gateway does not answer."""
    return asyncio.run(replay(config, pairs, evidence))
