"""The rule that turns a look-up's candidates into a semantic hit or a miss: plain numbers in, a choice out.

Live lookups and `brigade cache eval` both call `choose`, so what eval measures is what serves.

The embedding proposes, the checks only veto. The stored questions nearest the asked one, best
cosine first, are proposals once they reach the band's floor (`band_cosine`) and their entry's
own bar (an entry that once served a wrong answer at cosine c asks more than c from then on:
cache/evidence.py). A proposal is served
- at or above `serve_cosine` when no check objects: no guard vetoes it (cache/vetoes.py) and the
  pair model does not score it below `objection`;
- in the band below, only when the pair model agrees (`agree` or more).
The pair model sees at most two proposals, the best and the best whose stored answer differs (a
decision stays within tens of milliseconds). When both pass and their answers differ, the cache
cannot tell which answer applies and the model answers instead; a second entry holding the same
answer is no rival (an alias, or the same question stored twice).

Why not one fused score (the rule before): it asked the pair model for 0.99 at cosine 0.85 and
for 0.996 at 0.80, and the pair model read every reworded question as a different one, so most
rewordings missed. Here a close embedding is enough unless something specific objects.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class OperatingPoint:
    serve_cosine: float = 0.9  # at or above: served unless a check objects
    band_cosine: float = 0.8  # from here to serve_cosine: served when the pair model agrees
    agree: float = 0.5  # the pair model's probability that counts as agreeing in the band
    objection: float = 0.0  # below this probability the pair model objects even above serve_cosine

    @property
    def lower_serve_serves_more(self) -> bool:
        """Whether lowering serve_cosine serves more: the pair model's objection above it is no
        stricter than `agree` below it. Evidence learns serve_cosine (and its floor is sought) only
        then; a point with objection above agree is stricter above serve_cosine than below it."""
        return self.objection <= self.agree

    def clamped(self) -> "OperatingPoint":
        """A band that ends where serving on the embedding alone starts (a per-request
        `cache_threshold` below the band's floor moves the floor with it)."""
        return OperatingPoint(self.serve_cosine, min(self.band_cosine, self.serve_cosine), self.agree,
                              self.objection)


def point_from(tuned: dict, settings) -> OperatingPoint:
    """The trained numbers (stored with the pair model), each replaced by its setting when set
    (BRIGADE_CACHE_SERVE_COSINE, _BAND_COSINE, _AGREE, _OBJECTION)."""
    try:
        point = OperatingPoint(**tuned)
    except TypeError:  # a pair model tuned for another rule: its numbers mean nothing here
        point = OperatingPoint()
    chosen = {name: getattr(settings, f"cache_{name}") for name in ("serve_cosine", "band_cosine", "agree", "objection")}
    return OperatingPoint(**{**point.__dict__, **{k: v for k, v in chosen.items() if v is not None}}).clamped()


@dataclass(frozen=True)
class Candidate:
    entry_id: str
    question: str
    cosine: float
    vetoes: tuple[str, ...] = ()
    score: float | None = None  # the pair model's probability; None when it was not asked
    answer: str = ""  # the stored answer's digest ("" when unknown: every such entry is its own answer)
    bar: float = 0.0  # this entry's own cosine floor, raised by evidence of a wrong answer

    def proposed(self, point: OperatingPoint) -> bool:
        """No guard vetoed it and it reaches the band and its own bar: the pair model may be asked."""
        return not self.vetoes and self.cosine >= max(point.band_cosine, self.bar)

    def same_answer(self, other: "Candidate") -> bool:
        return bool(self.answer) and self.answer == other.answer


def proposals(candidates: list[Candidate], point: OperatingPoint) -> list[Candidate]:
    """The best proposal and the best one whose answer differs: what the pair model scores."""
    ranked = sorted((c for c in candidates if c.proposed(point)), key=lambda c: c.cosine, reverse=True)
    if not ranked:
        return []
    best = ranked[0]
    rival = next((c for c in ranked[1:] if not c.same_answer(best)), None)
    return [best] if rival is None else [best, rival]


def passes(c: Candidate, point: OperatingPoint) -> bool:
    if not c.proposed(point):
        return False
    if c.cosine >= point.serve_cosine:
        return c.score is None or c.score >= point.objection
    return c.score is not None and c.score >= point.agree


def choose(candidates: list[Candidate], point: OperatingPoint) -> Candidate | None:
    """The proposal to serve, or None. `candidates` carry the pair model's scores for
    `proposals(candidates, point)` (no others are needed)."""
    passing = [c for c in proposals(candidates, point) if passes(c, point)]
    if not passing:
        return None
    if len(passing) == 2 and not passing[0].same_answer(passing[1]):
        return None  # two stored answers fit: the cache cannot tell which
    return passing[0]
