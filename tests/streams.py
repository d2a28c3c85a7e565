"""Concurrent streaming clients for the fault tests (tests/test_failover.py on the tiny model,
tests/test_redis_failover.py on the real one): n clients, one connection each, a fault injected
once every client streams, and what an uninterrupted run says to compare them with."""
from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass, field

from websockets.asyncio.client import connect

from engine import EngineRequest, SamplingParams
from tests.clients import Answer, absorb
from tests.services import Stack

PROMPTS = [
    "Write a long story about a dragon who learns to bake bread.",
    "Explain in detail how a steam engine works.",
    "Describe a walk through a busy market in Marrakesh.",
    "Write a detailed guide to planting a vegetable garden.",
    "Tell me everything you know about the history of tea.",
    "Write a long letter to a friend about your summer holidays.",
    "Explain how the internet works, step by step, for a child.",
    "Describe the life cycle of a star in detail.",
]


def uninterrupted(engine, max_tokens: int) -> dict[str, str]:
    """What an uninterrupted greedy run says to each prompt, client id -> text, from an engine in
    the workers' deterministic mode."""
    out = engine.generate([
        EngineRequest(f"c{i}", SamplingParams(max_tokens=max_tokens), messages=[{"role": "user", "content": p}])
        for i, p in enumerate(PROMPTS)
    ])
    texts = {k: v.text for k, v in out.items()}
    # Only answers that differ from each other, and within themselves, can show a stream that was
    # continued wrongly (restarted, repeated, or given another's tokens).
    assert len(set(texts.values())) == len(PROMPTS), texts
    assert all(len(set(v.token_ids)) > len(v.token_ids) // 4 for v in out.values()), "answers of one repeated token"
    return texts


@dataclass
class Client:
    id: str
    answer: Answer
    times: list[float] = field(default_factory=list)  # arrival time of each token


async def stream_clients(url: str, fault, max_tokens: int, n: int = len(PROMPTS), tokens_first: int = 4,
                         timeout: float = 180, headers: dict | None = None):
    """n clients, one connection each, greedy requests; `fault(clients)` runs (in a thread) once
    every client has its first tokens. Returns the clients after every request has ended, and
    what `fault` returned."""
    clients = [Client(f"c{i}", Answer(f"c{i}")) for i in range(n)]
    started = asyncio.Event()

    async def one(c: Client, prompt: str):
        async with connect(url, additional_headers=headers) as ws:
            await ws.send(json.dumps({"type": "generate", "id": c.id, "max_tokens": max_tokens,
                                      "messages": [{"role": "user", "content": prompt}]}))
            answers = {c.id: c.answer}
            while c.answer.end is None:
                event = json.loads(await ws.recv())
                absorb(answers, event)
                if event["type"] == "token":
                    c.times.append(time.monotonic())
                if all(len(x.answer.tokens) >= tokens_first or x.answer.end for x in clients):
                    started.set()

    tasks = [asyncio.create_task(one(c, p)) for c, p in zip(clients, PROMPTS)]
    await asyncio.wait_for(started.wait(), 120)
    fault_result = await asyncio.to_thread(fault, clients)
    await asyncio.wait_for(asyncio.gather(*tasks), timeout)
    return clients, fault_result


def assert_complete(clients: list[Client], expected: dict[str, str], stack: Stack) -> None:
    """Every answer done, its indexes whole, its text the uninterrupted run's."""
    for c in clients:
        a = c.answer
        assert a.end is not None and a.end["type"] == "done", f"{c.id}: {a.end}\n{stack.tails()}"
        assert a.indexes == list(range(len(a.tokens))), f"{c.id}: indexes {a.indexes}"
        assert a.text == expected[c.id], f"{c.id}: {a.text!r} != {expected[c.id]!r}"


def claimed(stack: Stack, clients: list[Client]) -> bool:
    """Every client's request claimed by a worker of the stack, or already ended."""
    return all(c.answer.end is not None or stack.claimant(c.answer.request_id) for c in clients)


def busiest(stack: Stack, rids: list[str]) -> dict:
    """The stack's worker whose claims hold the most of these requests: {"worker", "requests"}.
    Claims, not heartbeats: a claim is written when a worker takes a request, a heartbeat lists it
    up to a second later, by when a short answer on the tiny model can have ended."""
    held: dict[str, list[str]] = {}
    for rid in rids:
        status = stack.claimant(rid)
        if status is not None and status["worker"] in stack.workers:
            held.setdefault(status["worker"], []).append(rid)
    assert held, "no worker of the stack claims any of these requests"
    worker = max(held, key=lambda w: len(held[w]))
    return {"worker": worker, "requests": held[worker]}
