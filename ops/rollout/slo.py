"""Service-level objectives as text: `ttft_p95<=2s,tpot_p50<=1.2x,error_rate<=0.01`.

One syntax for `bench serve --slo`, `capacity --slo` and `canary start --slo`. A latency objective
bounds a statistic (mean or pNN) of ttft, tpot, itl or e2e, either by seconds (`<=2s`, `<200ms`)
or by a ratio of the same statistic of a baseline measured in the same window (`<=1.2x`: at most
1.2 times the stable version's); error_rate is bounded by a fraction (`0.01`) or a percentage
(`1%`). Only a canary has a baseline, so a command without one parses with `allow_ratios=False`.

Pure: text in, objectives out; no Redis, no numbers measured here.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass

LATENCIES = ("ttft", "tpot", "itl", "e2e")


class InvalidObjective(ValueError):
    """An --slo objective that does not parse; the message says which and why."""


@dataclass(frozen=True)
class Objective:
    text: str  # as written, e.g. "ttft_p95<=2s"
    metric: str  # ttft | tpot | itl | e2e | error_rate
    stat: str  # mean | pNN; "" for error_rate
    op: str  # <= | <
    threshold: float  # seconds, a fraction for error_rate, or a ratio when `relative`
    relative: bool = False  # threshold times the baseline's same statistic (`<=1.2x`)

    @property
    def is_latency(self) -> bool:
        return self.metric in LATENCIES

    @property
    def name(self) -> str:
        """`ttft_p95`, `tpot_mean`, `error_rate`: the statistic this objective bounds."""
        return f"{self.metric}_{self.stat}" if self.stat else self.metric

    def limit(self, baseline: float | None = None) -> float | None:
        """The bound in the objective's own units: the threshold, or the ratio times the baseline
        (None when a ratio has no baseline to multiply)."""
        if not self.relative:
            return self.threshold
        return None if baseline is None else self.threshold * baseline

    def holds(self, value: float | None, baseline: float | None = None) -> bool:
        limit = self.limit(baseline)
        if value is None or math.isnan(value) or limit is None:
            return False
        return value <= limit if self.op == "<=" else value < limit


_NUMBER = r"(?P<value>\d+(?:\.\d*)?|\.\d+)"
_LATENCY = re.compile(
    rf"^(?P<metric>ttft|tpot|itl|e2e)_(?P<stat>mean|p\d+(?:\.\d+)?)(?P<op><=|<){_NUMBER}(?P<unit>ms|s|x)$")
_ERROR_RATE = re.compile(rf"^error_rate(?P<op><=|<){_NUMBER}(?P<unit>%|x)?$")
_NO_UNIT = re.compile(r"^(ttft|tpot|itl|e2e)_(mean|p[\d.]+)(<=|<)[\d.]+$")


def parse_slo(text: str, allow_ratios: bool = True) -> list[Objective]:
    """`ttft_p95<=2s,tpot_p50<=1.2x,error_rate<=0.01`: latencies ttft, tpot, itl, e2e with mean or
    pNN, <= or <, a number with s or ms, or a ratio with x (when `allow_ratios`); error_rate a
    fraction (0.01) or a percentage (1%)."""
    objectives = []
    for part in text.split(","):
        written = part.strip()
        compact = re.sub(r"\s+", "", written)
        if not compact:
            raise InvalidObjective(f"an empty objective in {text!r}")
        if m := _LATENCY.match(compact):
            stat = m["stat"]
            if stat != "mean" and not 0 < float(stat[1:]) <= 100:
                raise InvalidObjective(f"{written!r}: a percentile is p1..p100")
            relative = m["unit"] == "x"
            if relative and not allow_ratios:
                raise InvalidObjective(
                    f"{written!r}: a ratio (x) compares a canary with its stable version in the same window, and "
                    "this command has no stable version to compare with: give seconds (e.g. ttft_p95<=2s)")
            if relative and float(m["value"]) <= 0:
                raise InvalidObjective(f"{written!r}: a ratio is above 0 (e.g. 1.2x)")
            threshold = float(m["value"]) / (1000 if m["unit"] == "ms" else 1)
            objectives.append(Objective(written, m["metric"], stat, m["op"], threshold, relative))
        elif m := _ERROR_RATE.match(compact):
            if m["unit"] == "x":
                raise InvalidObjective(f"{written!r}: error_rate takes a fraction (0.01) or a percentage (1%), "
                                       "not a ratio (a stable version with no errors would allow none)")
            threshold = float(m["value"]) / (100 if m["unit"] == "%" else 1)
            if threshold > 1:
                raise InvalidObjective(f"{written!r}: error_rate is a fraction (0.01) or a percentage (1%)")
            objectives.append(Objective(written, "error_rate", "", m["op"], threshold))
        elif _NO_UNIT.match(compact):
            raise InvalidObjective(f"{written!r}: give the unit, s or ms (e.g. ttft_p95<=2s)"
                                   + (", or x for a ratio of the stable version (ttft_p95<=1.2x)" if allow_ratios else ""))
        else:
            ratio = " or a ratio of the stable version (ttft_p95<=1.2x)" if allow_ratios else ""
            raise InvalidObjective(
                f"{written!r} is not an objective: write METRIC_STAT<=VALUE with METRIC ttft, tpot, itl or e2e, "
                f"STAT mean or pNN and VALUE in s or ms (ttft_p95<=2s){ratio}, or error_rate<=FRACTION")
    return objectives
