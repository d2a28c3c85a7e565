"""A served-wrong rate's one-sided upper confidence bound: what the rate can be believed to stay
under on text nobody tuned on, given k wrong of n looked up.

Clopper and Pearson's exact bound: the largest p whose binomial chance of k or fewer wrong is still
1 - confidence (for k = 0 it is 1 - (1 - confidence)^(1/n), about 3/n at 95%). A rate measured on
76 look-alikes reads 0% and bounds at 3.9%: the bound, not the point, is what a target must hold.
"""
from __future__ import annotations

import math
from dataclasses import dataclass


def _binomial_cdf(k: int, n: int, p: float) -> float:
    """P(X <= k) for X ~ Binomial(n, p), summed in log space (n of thousands stays exact enough)."""
    if p <= 0.0:
        return 1.0
    if p >= 1.0:
        return 1.0 if k >= n else 0.0
    log_p, log_q = math.log(p), math.log1p(-p)
    terms = [math.lgamma(n + 1) - math.lgamma(i + 1) - math.lgamma(n - i + 1) + i * log_p + (n - i) * log_q
             for i in range(k + 1)]
    top = max(terms)
    return min(1.0, math.exp(top) * sum(math.exp(t - top) for t in terms))


def upper_bound(wrong: int, looked_up: int, confidence: float = 0.95) -> float:
    """The one-sided `confidence` upper bound of the rate `wrong / looked_up` (1.0 with nothing looked up)."""
    if not 0 <= wrong <= looked_up:
        raise ValueError(f"wrong must be within 0..looked_up, not {wrong} of {looked_up}")
    if looked_up == 0 or wrong == looked_up:
        return 1.0
    low, high = wrong / looked_up, 1.0
    for _ in range(60):  # bisection: the chance of `wrong` or fewer falls as p rises
        middle = (low + high) / 2
        if _binomial_cdf(wrong, looked_up, middle) > 1 - confidence:
            low = middle
        else:
            high = middle
    return high


@dataclass(frozen=True)
class Targets:
    """One-sided 95% upper bounds, on the tune files, that a kept point's rates must stay under, the
    chat look-alikes' rate itself, and the share of long reworded statements it must serve (a goal
    of its own: a point can buy Quora recall with long statements' and still raise the objective)."""

    max_lookalikes_bound: float = 0.02  # chat look-alikes (all kinds) served any answer
    max_kind_bound: float = 0.05  # each kind of chat look-alike on its own (about 150 of each: 2 served bound at 4.2%)
    max_paws_bound: float = 0.03  # PAWS pairs that mean something else, served any answer (the goal is 3%)
    max_paraphrase_wrong_bound: float = 0.05  # paraphrase look-ups served another entry's answer
    min_long_recall: float = 0.5  # chat rewordings of long statements (15+ words) served their own answer
    # The rate itself, beside its bound: the issue asks both (under 1%, bound under 2%), and a bound
    # under 2% on the 3,200 look-alikes of the tune files still lets the rate reach about 1.5%.
    max_lookalikes_rate: float = 0.01
