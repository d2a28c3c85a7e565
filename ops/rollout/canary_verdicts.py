"""A canary's evidence and its verdicts: each version's outcomes in a window summed up
(VersionStats), every objective judged on the canary's numbers (holds, breached, or waiting for
enough requests), and the one line a rollback gives as its reason.

Pure: outcomes and objectives in, numbers and verdicts out; the canary's record, its route and the
controller (canary.py) act on them.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Literal

from ops.rollout.outcomes import Outcome
from ops.core.percentiles import statistic
from ops.rollout.slo import Objective

STANDARD_STATS = ("ttft_p50", "ttft_p95", "tpot_p50", "e2e_p95")  # what `canary status` always shows
OUTCOME_METRICS = ("ttft", "tpot", "e2e")  # the latencies an outcome has (no inter-token gaps)


@dataclass
class VersionStats:
    """One version's outcomes in a window. Shadow copies are left out entirely (they served no
    one); latencies leave out cached answers (nothing was decoded) and errors."""

    requests: int = 0
    errors: int = 0
    cached: int = 0
    samples: dict[str, int] = field(default_factory=dict)  # ttft | tpot | e2e -> values measured
    stats: dict[str, float | None] = field(default_factory=dict)  # "ttft_p95" -> seconds

    @classmethod
    def of(cls, found: list[Outcome], wanted: tuple[str, ...] = ()) -> VersionStats:
        served = [o for o in found if not o.shadow]
        decoded = [o for o in served if not o.cached and not o.error]
        values = {m: [v for o in decoded if (v := getattr(o, f"{m}_s")) is not None] for m in OUTCOME_METRICS}
        names = dict.fromkeys([*STANDARD_STATS, *wanted])
        stats = {}
        for name in names:
            metric, _, stat = name.partition("_")
            if metric in values:
                stats[name] = statistic(values[metric], stat)
        return cls(requests=len(served), errors=sum(o.error for o in served), cached=sum(o.cached for o in served),
                   samples={m: len(v) for m, v in values.items()}, stats=stats)

    @property
    def fresh(self) -> int:
        """Requests the version itself answered (or failed): what a verdict needs enough of."""
        return self.requests - self.cached

    @property
    def error_rate(self) -> float | None:
        return self.errors / self.requests if self.requests else None

    @property
    def cache_hit_rate(self) -> float | None:
        return self.cached / self.requests if self.requests else None

    def value(self, objective: Objective) -> float | None:
        return self.error_rate if objective.metric == "error_rate" else self.stats.get(objective.name)

    def to_json(self) -> dict:
        return {**asdict(self), "fresh": self.fresh, "error_rate": self.error_rate,
                "cache_hit_rate": self.cache_hit_rate}


@dataclass(frozen=True)
class Verdict:
    """One objective judged on the canary: holds, breached, or waiting (and why)."""

    objective: str
    name: str  # the statistic: ttft_p95, error_rate
    state: Literal["holds", "breached", "waiting"]
    value: float | None
    limit: float | None
    baseline: float | None  # the stable version's same statistic
    relative: bool
    op: str
    why: str = ""  # for waiting: what is missing


def judge(objectives: list[Objective], canary: VersionStats, stable: VersionStats,
          min_requests: int) -> list[Verdict]:
    """Every objective on the canary's numbers. No verdict before the canary answered min_requests
    requests itself; a ratio also waits for min_requests samples of the stable version, since a
    ratio is only as sure as its weaker side (one stable answer that happened to be fast must not
    roll a healthy canary back)."""
    verdicts = []
    for o in objectives:
        value, baseline = canary.value(o), stable.value(o)
        common = dict(objective=o.text, name=o.name, value=value, baseline=baseline, relative=o.relative, op=o.op)
        if canary.fresh < min_requests:
            why = f"{canary.fresh} of {min_requests} requests"
            verdicts.append(Verdict(state="waiting", limit=o.limit(baseline), why=why, **common))
        elif o.relative and stable.samples.get(o.metric, 0) < min_requests:
            why = f"{stable.samples.get(o.metric, 0)} of {min_requests} {o.metric} samples of the stable version"
            verdicts.append(Verdict(state="waiting", limit=o.limit(baseline) if baseline is not None else None, why=why,
                                    **common))
        elif value is None:
            verdicts.append(Verdict(state="waiting", limit=o.limit(baseline), why=f"no {o.metric} sample", **common))
        else:
            state = "holds" if o.holds(value, baseline) else "breached"
            verdicts.append(Verdict(state=state, limit=o.limit(baseline), **common))
    return verdicts


def _ratio(value: float) -> str:
    """1.9 -> "1.9", 2 -> "2.0", 1.24 -> "1.24": a ratio near its limit keeps its second decimal."""
    return f"{value:.1f}" if round(value, 1) == round(value, 2) else f"{value:.2f}"


def _amount(name: str, value: float) -> str:
    return f"{value:.3g}" if name == "error_rate" else f"{value:.3g}s"


def breach_reason(verdict: Verdict, requests: int) -> str:
    """`rolled back: ttft_p95 1.9x stable over 63 requests`, or, for an absolute objective,
    `rolled back: error_rate 0.05 > 0.01 over 63 requests`."""
    if verdict.relative:
        ratio = verdict.value / verdict.baseline if verdict.baseline else math.inf
        said = f"{_ratio(ratio)}x stable" if math.isfinite(ratio) else f"{_amount(verdict.name, verdict.value)} (stable 0)"
    else:
        op = ">" if verdict.op == "<=" else ">="
        said = f"{_amount(verdict.name, verdict.value)} {op} {_amount(verdict.name, verdict.limit)}"
    return f"rolled back: {verdict.name} {said} over {requests} requests"
