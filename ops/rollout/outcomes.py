"""What each version's finished requests looked like, kept where every canary controller reads it.

The gateway that settles a request appends one entry to its version's outcome stream
(redis_keys.outcomes, capped and expiring): when it ended, its latencies as the client saw them, whether
it failed, whether the cache answered it, and for a shadow copy whether its text equals the
served answer. A canary compares two versions over a sliding window of these entries, whichever
gateway served them; Prometheus's histograms are per process and cannot be windowed that way.
"""
from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass

from ops.core import redis_keys
from ops.core.settings import Settings


@dataclass(frozen=True)
class Outcome:
    at: float  # unix seconds when it ended
    ttft_s: float | None = None
    tpot_s: float | None = None  # (end - first token) / (tokens - 1), for answers of 2 tokens or more
    e2e_s: float | None = None
    error: bool = False
    cached: bool = False
    shadow: bool = False
    same_text: bool | None = None  # a shadow's answer equal to the served one (None: not compared)

    def fields(self) -> dict[str, str]:
        def num(value: float | None) -> str:
            return "" if value is None else f"{value:.6f}"

        return {"at": f"{self.at:.3f}", "ttft": num(self.ttft_s), "tpot": num(self.tpot_s), "e2e": num(self.e2e_s),
                "error": "1" if self.error else "0", "cached": "1" if self.cached else "0",
                "shadow": "1" if self.shadow else "0",
                "same": "" if self.same_text is None else "1" if self.same_text else "0"}

    @classmethod
    def from_fields(cls, raw: dict) -> Outcome:
        def text(name: str) -> str:
            value = raw.get(name, raw.get(name.encode(), ""))
            return value.decode() if isinstance(value, bytes) else value

        def num(name: str) -> float | None:
            value = text(name)
            return float(value) if value else None

        same = text("same")
        return cls(at=float(text("at") or 0), ttft_s=num("ttft"), tpot_s=num("tpot"), e2e_s=num("e2e"),
                   error=text("error") == "1", cached=text("cached") == "1", shadow=text("shadow") == "1",
                   same_text=None if not same else same == "1")


def from_timing(timing: dict | None, usage: dict | None, error: bool = False, cached: bool = False,
                shadow: bool = False, same_text: bool | None = None, at: float | None = None) -> Outcome:
    """An outcome from a `done` event's timing and usage (an error has neither)."""
    timing, usage = timing or {}, usage or {}
    ttft, e2e = timing.get("ttft_s"), timing.get("e2e_s")
    tokens = int(usage.get("completion_tokens") or 0)
    tpot = timing.get("tpot_s")  # the worker's own (its first token to its last, per token)
    if tpot is None and ttft is not None and e2e is not None and tokens > 1:
        tpot = (e2e - ttft) / (tokens - 1)
    return Outcome(at=time.time() if at is None else at, ttft_s=ttft, tpot_s=tpot, e2e_s=e2e, error=error,
                   cached=cached, shadow=shadow, same_text=same_text)


def _append(pipe, settings: Settings, model: str, version: str, outcome: Outcome):
    """Queue one outcome on a pipeline: the entry (capped) and the stream's TTL renewed."""
    name = redis_keys.outcomes(model, version)
    pipe.xadd(name, outcome.fields(), maxlen=redis_keys.outcomes_maxlen(settings), approximate=True)
    pipe.expire(name, redis_keys.outcomes_ttl_s(settings))
    return pipe


async def record(client, settings: Settings, model: str, version: str, outcome: Outcome) -> None:
    """Append one outcome to its version's stream (capped, and its TTL renewed)."""
    await _append(client.pipeline(transaction=False), settings, model, version, outcome).execute()


def record_sync(client, settings: Settings, model: str, version: str, outcome: Outcome) -> None:
    _append(client.pipeline(transaction=False), settings, model, version, outcome).execute()


def window(client, model: str, version: str, since: float, until: float | None = None) -> list[Outcome]:
    """A version's outcomes that ended in [since, until] (stream ids are the time they were added)."""
    start = f"{int(since * 1000)}-0"
    end = f"{int(until * 1000)}-99999999" if until is not None else "+"
    return [Outcome.from_fields(fields) for _id, fields in client.xrange(redis_keys.outcomes(model, version), start, end)]


class WindowReader:
    """Sliding windows of several versions' outcomes, read incrementally: each call reads only the
    entries added since the last one (XRANGE from the last id seen), so a controller that looks
    every second at a 10-minute window costs the new outcomes, not the whole window (reading 2,000
    entries whole took 90 ms here; a busy version's window holds tens of thousands)."""

    def __init__(self) -> None:
        self._seen: dict[str, tuple[str, deque]] = {}  # stream -> (last id read, [(ms, outcome)] in order)

    def window(self, client, model: str, version: str, since: float, until: float | None = None) -> list[Outcome]:
        name = redis_keys.outcomes(model, version)
        since_ms = int(since * 1000)
        last, kept = self._seen.get(name, (None, deque()))
        if last is None:
            start = f"{since_ms}-0"
        else:
            start = "(" + last
        while True:
            entries = client.xrange(name, start, "+", count=1000)
            for entry_id, fields in entries:
                kept.append((int(entry_id.split("-")[0]), Outcome.from_fields(fields)))
                last = entry_id
            if len(entries) < 1000:
                break
            start = "(" + last
        while kept and kept[0][0] < since_ms:
            kept.popleft()
        self._seen[name] = (last, kept)
        until_ms = None if until is None else int(until * 1000)
        return [o for ms, o in kept if until_ms is None or ms <= until_ms]
