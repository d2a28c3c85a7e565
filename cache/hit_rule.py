"""The rule that turns scored candidates into a semantic hit or a miss: plain numbers in, a choice out.

Live lookups and `brigade cache eval` both call `choose`, so what eval measures is what serves.
Contenders are the candidates that no guard vetoed and whose cosine reaches the floor (the
pair model scores only those: it costs milliseconds a candidate). Each gets a value:
- the pair model's probability, its log-odds moved by `cosine_weight` x (cosine - 0.85): the
  embedding was trained on far more text than the pair model and adds what the pair model
  misses (on held-out duplicate questions the fusion gained about 0.1 precision at equal
  recall); the cosine itself, when no pair model decides;
- or 1.0 when the embedding finds the two very close (`rescue_cosine`) and the pair model does
  not object (`rescue_score`): the pair model learned on short questions and is unsure of long
  reworded statements, which the embedding finds well. Two signals, each covering the other.
The best contender is served when its value reaches the threshold and no other contender, with
different text, reaches the ambiguity limit: then the cache cannot tell which stored answer
applies, and the model answers instead.
"""
from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class OperatingPoint:
    threshold: float
    min_cosine: float = 0.0
    ambiguity: float = 1.01  # above any value: the rule is off
    rescue_cosine: float = 1.01  # above any cosine: no rescue
    rescue_score: float = 0.0
    cosine_weight: float = 0.0


@dataclass(frozen=True)
class Candidate:
    entry_id: str
    question: str
    cosine: float
    vetoes: tuple[str, ...] = ()
    score: float | None = None  # the pair model's probability; None when it did not decide

    @property
    def value(self) -> float:
        return self.score if self.score is not None else self.cosine

    def contends(self, min_cosine: float) -> bool:
        """No guard vetoed it and it reaches the cosine floor: the rule considers it."""
        return not self.vetoes and self.cosine >= min_cosine


def same_text(a: str, b: str) -> bool:
    return " ".join(a.lower().split()) == " ".join(b.lower().split())


COSINE_CENTRE = 0.85


def value(c: Candidate, point: OperatingPoint) -> float:
    if c.score is None:
        return c.cosine
    if c.cosine >= point.rescue_cosine and c.score >= point.rescue_score:
        return 1.0
    if not point.cosine_weight:
        return c.score
    p = min(max(c.score, 1e-7), 1 - 1e-7)
    z = math.log(p / (1 - p)) + point.cosine_weight * (c.cosine - COSINE_CENTRE)
    return 1.0 / (1.0 + math.exp(-z))


def ranked(candidates: list[Candidate], point: OperatingPoint) -> list[tuple[float, Candidate]]:
    """The contenders with their values: unvetoed, at or above the cosine floor, best first."""
    return sorted(((value(c, point), c) for c in candidates if c.contends(point.min_cosine)),
                  key=lambda vc: vc[0], reverse=True)


def best_and_rival(candidates: list[Candidate], point: OperatingPoint) -> tuple[float, Candidate | None, float]:
    """The best contender's value and itself, and the best value among rivals of different text."""
    contenders = ranked(candidates, point)
    if not contenders:
        return -1.0, None, -1.0
    best_value, best = contenders[0]
    rival = next((v for v, c in contenders[1:] if not same_text(c.question, best.question)), -1.0)
    return best_value, best, rival


def choose(candidates: list[Candidate], point: OperatingPoint) -> Candidate | None:
    best_value, best, rival = best_and_rival(candidates, point)
    if best is None or best_value < point.threshold or rival >= point.ambiguity:
        return None
    return best
