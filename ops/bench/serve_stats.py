"""The measures of a load test and its service-level objectives: per-request latencies, the run's
throughput and latency distributions, objectives such as `ttft_p95<=2s,error_rate<=0.01` judged
pass or fail (k6's thresholds), and goodput (vLLM's: requests per second that met every latency
objective).

Pure: request results in, numbers and verdicts out.
"""
from __future__ import annotations

import asyncio
import time

from collections import Counter
from dataclasses import asdict, dataclass, field

from ops.rollout import slo
from ops.core.percentiles import percentile, statistic
from ops.rollout.slo import LATENCIES, InvalidObjective, Objective  # noqa: F401 (callers import them from here)

PERCENTILES = (50, 90, 95, 99)


@dataclass
class RequestResult:
    """One request as the client saw it. Times in seconds; `start_s` from the run's start."""

    index: int
    kind: str = "fresh"  # fresh | exact | reworded (serve_workload.PlannedRequest.kind)
    start_s: float = 0.0
    ttft_s: float | None = None  # to the first piece with text
    e2e_s: float | None = None
    itl_s: list[float] = field(default_factory=list)  # gaps between pieces with text
    output_tokens: int = 0  # the server's count when it gave one, else the pieces counted
    cached: str | None = None  # exact | semantic: the answer came from Brigade's cache
    finish_reason: str | None = None
    error: str | None = None  # a stable code when the request failed
    prompt_tokens: int | None = None  # the server's count of the prompt's tokens, when it gave one

    @property
    def ok(self) -> bool:
        return self.error is None and self.e2e_s is not None

    @property
    def tpot_s(self) -> float | None:
        """Time per output token after the first, as vLLM computes it. None for a cached answer (no
        token was decoded) and for answers of one token."""
        if not self.ok or self.cached or self.ttft_s is None or self.output_tokens < 2:
            return None
        return (self.e2e_s - self.ttft_s) / (self.output_tokens - 1)

    def latency(self, metric: str, stat: str = "mean") -> float | None:
        """This request's own value of a latency: ttft, tpot and e2e are one number; itl is its gaps'
        `stat` (a request meets `itl_p95<=x` when 95% of its own gaps are within x)."""
        if metric == "ttft":
            return self.ttft_s
        if metric == "tpot":
            return self.tpot_s
        if metric == "e2e":
            return self.e2e_s
        if metric == "itl":
            return statistic(self.itl_s, stat) if self.itl_s and not self.cached else None
        raise ValueError(f"unknown latency {metric!r}")

    def to_json(self) -> dict:
        out = asdict(self)
        for name in ("start_s", "ttft_s", "e2e_s"):
            out[name] = _round(out[name])
        out["itl_s"] = [_round(g) for g in self.itl_s]
        out["tpot_s"] = _round(self.tpot_s)
        return out

    @classmethod
    def from_json(cls, row: dict) -> "RequestResult":
        known = {k: row[k] for k in ("index", "kind", "start_s", "ttft_s", "e2e_s", "itl_s", "output_tokens",
                                     "prompt_tokens", "cached", "finish_reason", "error") if k in row}
        return cls(**known)


def _round(value: float | None, digits: int = 6) -> float | None:
    return None if value is None else round(value, digits)


# ---- distributions --------------------------------------------------------------------------------


def distribution(values) -> dict:
    """mean, p50, p90, p95, p99 (seconds, rounded to microseconds) and how many values."""
    out = {"mean": _round(statistic(values, "mean"))}
    for q in PERCENTILES:
        out[f"p{q}"] = _round(percentile(values, q))
    out["count"] = len(values)
    return out


def latency_values(results: list[RequestResult], metric: str) -> list[float]:
    """A latency over the successful requests; itl is every gap of every decoded answer (vLLM's)."""
    ok = [r for r in results if r.ok]
    if metric == "itl":
        return [g for r in ok if not r.cached for g in r.itl_s]
    values = (r.latency(metric) for r in ok)
    return [v for v in values if v is not None]


def run_metrics(results: list[RequestResult], duration_s: float) -> dict:
    """What the run achieved: throughput, latency distributions, errors, the cache."""
    ok = [r for r in results if r.ok]
    errors = Counter(r.error for r in results if not r.ok)
    output_tokens = sum(r.output_tokens for r in ok)
    busy = sum(r.e2e_s for r in results if r.e2e_s is not None)
    cached = Counter(r.cached for r in ok if r.cached)
    kinds = Counter(r.kind for r in results)
    per_s = (lambda n: round(n / duration_s, 4)) if duration_s > 0 else (lambda n: None)
    out = {
        "duration_s": round(duration_s, 4),
        "requests": {"sent": len(results), "completed": len(ok), "failed": len(results) - len(ok),
                     "fresh": kinds["fresh"], "exact_repeats": kinds["exact"], "reworded_repeats": kinds["reworded"]},
        "request_throughput": per_s(len(ok)),
        "output_token_throughput": per_s(output_tokens),
        "total_output_tokens": output_tokens,
        # Little's law, measured: the time-average number of requests in flight.
        "concurrency_mean": per_s(busy),
    }
    for metric in LATENCIES:
        out[f"{metric}_s"] = distribution(latency_values(results, metric))
    out["errors"] = dict(sorted(errors.items()))
    out["error_rate"] = round(len(results) and (len(results) - len(ok)) / len(results), 6)
    out["cache"] = {"hits": sum(cached.values()), "exact": cached["exact"], "semantic": cached["semantic"],
                    "hit_ratio": round(sum(cached.values()) / len(ok), 4) if ok else None}
    return out


# ---- objectives -----------------------------------------------------------------------------------


def parse_slo(text: str) -> list[Objective]:
    """A load test's objectives (ops/rollout/slo.py has the syntax): absolute only, since a run has
    no stable version to be a ratio of; a ratio (`ttft_p95<=1.2x`) is refused with InvalidObjective."""
    return slo.parse_slo(text, allow_ratios=False)


def measured(objective: Objective, results: list[RequestResult]) -> float | None:
    """The run's value of what an objective constrains."""
    if objective.metric == "error_rate":
        return (sum(not r.ok for r in results) / len(results)) if results else None
    return statistic(latency_values(results, objective.metric), objective.stat)


def meets_latency_objectives(result: RequestResult, objectives: list[Objective]) -> bool:
    """Whether one request was good: it succeeded and each of its own latencies is within every
    latency objective's threshold (one it has no value for, as tpot of a cached answer, it meets)."""
    if not result.ok:
        return False
    for o in objectives:
        if not o.is_latency:
            continue
        value = result.latency(o.metric, o.stat)
        if o.metric == "ttft" and value is None:
            value = result.e2e_s  # no text at all: the wait for the first token was the whole answer
        if value is not None and not o.holds(value):
            return False
    return True


def judge(objectives: list[Objective], results: list[RequestResult], duration_s: float) -> dict:
    """Every objective's measured value and verdict, whether all passed, and the goodput."""
    verdicts = []
    for o in objectives:
        value = measured(o, results)
        verdicts.append({"objective": o.text, "metric": o.metric, "stat": o.stat or None, "op": o.op,
                         "threshold": o.threshold, "measured": _round(value), "passed": o.holds(value)})
    good = sum(meets_latency_objectives(r, objectives) for r in results)
    return {"objectives": verdicts, "passed": all(v["passed"] for v in verdicts), "good_requests": good,
            "goodput": round(good / duration_s, 4) if duration_s > 0 else None}


def describe(verdict: dict) -> str:
    """`PASS ttft_p95<=2s (measured 1.234 s)`."""
    value = verdict["measured"]
    if value is None:
        shown = "no value"
    elif verdict["metric"] == "error_rate":
        shown = f"{value:.4f}"
    else:
        shown = f"{value:.3f} s" if value >= 0.1 else f"{value * 1000:.1f} ms"
    return f"{'PASS' if verdict['passed'] else 'FAIL'} {verdict['objective']} (measured {shown})"


async def await_or_time_out(tasks: list, timeout_s: float, results: list[RequestResult], start: float) -> set:
    """Wait for the load's tasks at most `timeout_s`; the rest are cancelled, and every request
    still unanswered is a `client_timeout` ending now. Returns the tasks that finished."""
    done, pending = await asyncio.wait(tasks, timeout=max(0.0, timeout_s))
    for task in pending:
        task.cancel()
    if pending:
        await asyncio.wait(pending)
        now = time.perf_counter()
        for result in results:
            if result.e2e_s is None:
                result.e2e_s = now - start - result.start_s
                result.error = "client_timeout"
    return done
