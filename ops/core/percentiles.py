"""The one percentile every figure Brigade reports is taken by: a canary's verdict, a bench's
table and a chaos run's summary read the same values the same way.

The q-th percentile (q in 0..100) interpolates linearly between the two closest ranks of the sorted
values, rank (n - 1) q / 100: numpy's default method, and vLLM's bench (docs/benchmarks.md). Plain
Python, so that the gateway's canary controller does not import numpy for it.
"""
from __future__ import annotations

import math
from collections.abc import Iterable


def percentile(values: Iterable[float], q: float) -> float | None:
    """The q-th percentile (0..100) of the values; None for none."""
    if not 0 <= q <= 100:
        raise ValueError(f"a percentile is between 0 and 100 (got {q})")
    ordered = sorted(float(v) for v in values)
    if not ordered:
        return None
    rank = (len(ordered) - 1) * q / 100.0
    low = math.floor(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def statistic(values: Iterable[float], stat: str) -> float | None:
    """`mean` or `pNN` (a percentile, e.g. p95 or p99.9) of the values; None for none."""
    values = list(values)
    if stat == "mean":
        return sum(values) / len(values) if values else None
    if stat.startswith("p"):
        try:
            q = float(stat[1:])
        except ValueError:
            raise ValueError(f"unknown statistic {stat!r}: mean or pNN") from None
        return percentile(values, q)
    raise ValueError(f"unknown statistic {stat!r}: mean or pNN")
