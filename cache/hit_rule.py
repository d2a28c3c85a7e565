"""The rule that turns scored candidates into a semantic hit or a miss: plain numbers in, a choice out.

Live lookups and `brigade cache eval` both call `choose`, so what eval measures is what serves.
Contenders are the candidates that no guard vetoed and whose cosine reaches the floor (the
pair model scores only those: it costs milliseconds a candidate). The best contender is served when
- its value (the pair model's probability, or the cosine when no pair model decides) reaches
  the threshold, and
- no other contender, with different text, reaches the ambiguity limit: then the cache cannot
  tell which stored answer applies, and the model answers instead.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class OperatingPoint:
    threshold: float
    min_cosine: float = 0.0
    ambiguity: float = 1.01  # above any value: the rule is off


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


def same_text(a: str, b: str) -> bool:
    return " ".join(a.lower().split()) == " ".join(b.lower().split())


def ranked(candidates: list[Candidate], min_cosine: float = 0.0) -> list[Candidate]:
    """The contenders: unvetoed, at or above the cosine floor, best value first."""
    return sorted((c for c in candidates if not c.vetoes and c.cosine >= min_cosine), key=lambda c: c.value,
                  reverse=True)


def choose(candidates: list[Candidate], point: OperatingPoint) -> Candidate | None:
    contenders = ranked(candidates, point.min_cosine)
    if not contenders:
        return None
    best = contenders[0]
    rival = next((c for c in contenders[1:] if not same_text(c.question, best.question)), None)
    if best.value < point.threshold:
        return None
    if rival is not None and rival.value >= point.ambiguity:
        return None
    return best
