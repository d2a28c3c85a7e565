"""A batch job through the faults of `bench chaos`: submitted when the load starts, read back at the end.

B lines (distinct greedy questions, so none is answered from another's copy: docs/batch.md),
submitted inline (`POST /v1/batches` with `input`) to whichever gateway answers. It runs in the
rows the interactive load leaves free and through every fault, and is followed over HTTP at any
live gateway until it ends. The check: every custom_id exactly once in the output, in input order,
every line readable JSON, and each line's outcome.
"""
from __future__ import annotations

import asyncio
import json
import time
from collections import Counter

import httpx

from ops.bench.load_clients import QUESTIONS

ENDED = ("completed", "failed", "cancelled", "expired")


def batch_lines(n: int, max_tokens: int) -> list[dict]:
    return [{"custom_id": f"line-{i}", "method": "POST", "url": "/v1/chat/completions",
             "body": {"messages": [{"role": "user", "content": f"{QUESTIONS[i % len(QUESTIONS)]} (number {i})"}],
                      "max_tokens": max_tokens, "temperature": 0}} for i in range(n)]


class NoGateway(Exception):
    """No gateway answered for a minute."""


async def _any_gateway(http: httpx.AsyncClient, urls: list[str], method: str, path: str, **kw) -> httpx.Response:
    """The first gateway to answer (one may be dead or starting), trying each again for a minute."""
    deadline = time.monotonic() + 60
    while True:
        for url in urls:
            try:
                resp = await http.request(method, url + path, **kw)
            except httpx.TransportError:
                continue
            if resp.status_code < 500:
                return resp
        if time.monotonic() > deadline:
            raise NoGateway(f"no gateway answered {method} {path} for a minute")
        await asyncio.sleep(1)


class BatchLoad:
    """One job of `n` lines: `submit`, then `follow` until it ends or `deadline`, then `check`."""

    def __init__(self, urls: list[str], n: int, max_tokens: int):
        self.urls, self.lines = urls, batch_lines(n, max_tokens)
        self.http = httpx.AsyncClient(timeout=60)
        self.job_id: str | None = None
        self.job: dict = {}
        self.written_at: dict[str, int] = {}  # moment -> lines written then (e.g. when the load ends)
        self.unanswered = 0  # polls that no gateway answered for a minute

    async def submit(self) -> str:
        resp = await _any_gateway(self.http, self.urls, "POST", "/v1/batches",
                                  json={"input": self.lines, "endpoint": "/v1/chat/completions"})
        resp.raise_for_status()
        self.job_id = resp.json()["id"]
        return self.job_id

    async def poll(self) -> dict:
        """The job as a gateway says it is now; as last seen when none answers (noted in `unanswered`)."""
        try:
            resp = await _any_gateway(self.http, self.urls, "GET", f"/v1/batches/{self.job_id}")
        except NoGateway:
            self.unanswered += 1
            return self.job
        self.job = resp.json()
        return self.job

    def note(self, moment: str) -> None:
        self.written_at[moment] = self.job.get("brigade", {}).get("written", 0)

    async def follow(self, deadline: float) -> dict:
        while time.monotonic() < deadline:
            if (await self.poll()).get("status") in ENDED:
                break
            await asyncio.sleep(2)
        return self.job

    async def check(self) -> dict:
        """The job's end and its output line by line: lost, doubled, out of order, failed."""
        out = {"lines": len(self.lines), "job_id": self.job_id, "status": self.job.get("status"),
               "request_counts": self.job.get("request_counts"), "written_at": self.written_at,
               "polls_unanswered": self.unanswered}
        file_id = self.job.get("output_file_id")
        if file_id is None:  # not ended: what it wrote so far is in no file we can read
            out.update(lost=None, doubled=None, note="the job had not ended: its output was not read")
            return out
        try:
            resp = await _any_gateway(self.http, self.urls, "GET", f"/v1/files/{file_id}/content")
        except NoGateway as exc:
            out.update(lost=None, doubled=None, note=str(exc))
            return out
        if resp.status_code != 200:
            out.update(lost=None, doubled=None, note=f"the output file answered {resp.status_code}: {resp.text[:200]}")
            return out
        results, unreadable = [], []
        for text in resp.text.splitlines():
            try:
                line = json.loads(text)
            except ValueError:
                line = None
            if isinstance(line, dict) and "custom_id" in line:
                results.append(line)
            else:  # a corrupt line (two writers, a hole of zero bytes): unreadable, and its line lost
                unreadable.append(text[:120])
        ids = [r["custom_id"] for r in results]
        counts = Counter(ids)
        expected = [line["custom_id"] for line in self.lines]
        outcomes = Counter(_outcome(r) for r in results)
        lost, doubled = [i for i in expected if i not in counts], [i for i in expected if counts[i] > 1]
        out.update(lost=len(lost), doubled=len(doubled), unknown=len(set(counts) - set(expected)),
                   unreadable=len(unreadable), unreadable_lines=unreadable[:5],
                   lost_ids=lost[:20], doubled_ids=doubled[:20],
                   in_input_order=[i for i in ids if i in set(expected)] == [i for i in expected if i in counts],
                   outcomes=dict(outcomes))
        return out

    async def close(self) -> None:
        await self.http.aclose()


def _outcome(result: dict) -> str:
    if result.get("error"):
        return result["error"].get("code", "error")
    response = result.get("response") or {}
    if response.get("status_code") == 200:
        return "ok"
    return ((response.get("body") or {}).get("error") or {}).get("code") or f"http_{response.get('status_code')}"
