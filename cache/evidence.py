"""Evidence that a stored answer fits a question, and the thresholds it supports under an error bound.

An observation is a pair the cache could have served (a proposal of cache/hit_rule.py) whose two
answers were compared: the stored answer and the model's own answer to the asked question. Three
sources give them, as vCache (arXiv 2502.03771) learns from:
- near misses: a proposal that was not served, so the model answered; its answer is compared
  with the proposal's when it ends (cache/insert_path.py, on insert);
- audits: a share (`cache_audit_share`) of semantic hits asked again of the model in the batch
  lane (gateway/admission/audits.py); these are the unbiased sample of what is served;
- feedback: a client or operator reporting a served answer wrong.
All three make theirs with `observed` (the one place an observation is made): a known source,
stamped with when it was seen.

An observation's verdict (`agreed`) is the judge's (`judge`): the stored answer fits the asked
question when it is about it nearly as much as about the question it was stored for (the answer's
embedding cosine with the asked question at most `cache_judge_margin` below its cosine with the
stored one). The model's own answer is not the judge: a small model answers two wordings of one
question differently most of the time (SmolLM2-135M: 81% of the tune split's rewordings under an
answer cosine of 0.9), so "the model would have said something else" is not "the answer is wrong".
That comparison is kept beside the verdict as `same_as_model` (audits and near misses, which have
the model's answer): equal text up to case and spacing, or an answer cosine of at least
`cache_answer_agreement`. What the judge can see, and what it cannot, is in docs/cache.md: a
served answer about another entity or number reads as not fitting; one whose question only
changed its direction, negation, roles or word order reads as fitting, so the bounds on those
kinds are the held-out ones (the floor) and cannot be learned live.

From the observations (capped and expiring in Redis, keys.CACHE_EVIDENCE) each gateway learns:
- `serve_cosine`: the lowest cosine at which, among the observations at or above it that the pair
  model did not object to, the error rate's upper bound (Wilson, one-sided 95%) is at most
  `cache_max_error` (delta). Lower than the trained value only when the evidence proves it; higher
  when the evidence at the trained value shows errors above delta (its lower bound exceeds it).
  Fixed at the trained value when `objection` is above `agree` (see `learn`).
- `agree`: the same over the pair model's probability, for the band below serve_cosine.
- neither goes below the floor chosen with the trained point (`Floor`): the lowest thresholds at
  which the look-alike bounds still held on the tune files;
- per entry: a wrong answer observed at cosine c raises that entry's bar above c
  (hit_rule.Candidate.bar), so it is not served at that distance again. Per-entry thresholds are
  only raised: lowering one entry's bar under delta = 1% would take about 270 agreeing
  observations of that entry alone.
"""
from __future__ import annotations

import json
import math
import time
from dataclasses import asdict, dataclass, replace

import numpy as np

from cache.hit_rule import OperatingPoint

Z_ONE_SIDED_95 = 1.645
Z_TWO_SIDED_95 = 1.96
BAR_MARGIN = 0.01  # how far above a wrong answer's cosine its entry's bar goes
SOURCES = ("near_miss", "audit", "feedback")


@dataclass(frozen=True)
class Observation:
    cosine: float
    score: float | None  # the pair model's probability (None: not asked)
    agreed: bool  # the judge's verdict: the stored answer fits the asked question (judge)
    source: str  # near_miss | audit | feedback
    entry: str
    at: float = 0.0
    same_as_model: bool | None = None  # the model's own answer agreed with the stored one (None: not compared)

    def to_json(self) -> str:
        return json.dumps({**asdict(self), "at": self.at or time.time()})

    @classmethod
    def from_json(cls, raw: str) -> "Observation | None":
        try:
            d = json.loads(raw)
            score, same = d.get("score"), d.get("same_as_model")
            return cls(float(d["cosine"]), None if score is None else float(score), bool(d["agreed"]),
                       str(d["source"]), str(d["entry"]), float(d.get("at", 0.0)),
                       None if same is None else bool(same))
        except (ValueError, KeyError, TypeError):
            return None  # one unreadable observation is skipped, not fatal


def observed(source: str, *, entry: str, cosine: float, score: float | None, agreed: bool,
             same_as_model: bool | None = None) -> Observation:
    """Evidence about one pairing of a question with a stored entry (`cosine` apart, `score` the
    pair model's say or None): near misses (cache/insert_path.py), audits (gateway/admission/audits.py) and
    feedback (gateway/admission/admission.py) all come through here. Keyword-only: a cosine and a score
    swapped would move the thresholds without a word."""
    if source not in SOURCES:
        raise ValueError(f"unknown evidence source {source!r} (one of {', '.join(SOURCES)})")
    return Observation(cosine, score, agreed, source, entry, time.time(), same_as_model)


def wilson(errors: int, n: int, z: float = Z_TWO_SIDED_95) -> tuple[float, float]:
    """The Wilson score interval of a rate errors/n."""
    if n == 0:
        return 0.0, 1.0
    p = errors / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return max(0.0, centre - half), min(1.0, centre + half)


def upper(errors: int, n: int) -> float:
    return wilson(errors, n, Z_ONE_SIDED_95)[1]


def lower(errors: int, n: int) -> float:
    return wilson(errors, n, Z_ONE_SIDED_95)[0]


def lowest_safe(values: np.ndarray, wrong: np.ndarray, delta: float, trained: float) -> tuple[float, str]:
    """The threshold on `values` (cosines or probabilities) the evidence supports, and why.

    Candidates are the observed values themselves: serving from value v means serving every
    observation at or above v. The lowest v whose error's upper bound is within delta wins when it
    is below the trained value; else the trained value stands unless the evidence at it shows an
    error rate above delta (its lower bound exceeds delta), in which case the threshold rises to the
    lowest value proven safe, or, with none proven yet, as little as the evidence allows."""
    if not len(values):
        return trained, "trained"
    order = np.argsort(-values)
    v, w = values[order], wrong[order].astype(int)
    errors_above = np.cumsum(w)  # errors among the i+1 highest values
    # Index i stands for serving from v[i]: only the last of a run of equal values counts.
    ends = [i for i in range(len(v)) if i + 1 == len(v) or v[i + 1] != v[i]]
    safe = next((float(v[i]) for i in reversed(ends) if upper(int(errors_above[i]), i + 1) <= delta), None)
    if safe is not None and safe < trained:
        return safe, "evidence_lower"
    at_trained = v >= trained
    n, e = int(at_trained.sum()), int(w[at_trained].sum())
    if n and lower(e, n) > delta:
        if safe is not None:
            return safe, "evidence_higher"
        # Nothing proven safe yet: the least raise the evidence does not refute.
        refuted_not = (float(v[i]) for i in reversed(ends) if v[i] > trained
                       and lower(int(errors_above[i]), i + 1) <= delta)
        return next(refuted_not, float(v[0]) + 1e-6), "evidence_higher"
    return trained, "trained"


@dataclass(frozen=True)
class Learned:
    point: OperatingPoint
    why: dict  # per threshold: trained | evidence_lower | evidence_higher | floor
    observations: int


@dataclass(frozen=True)
class Floor:
    """The lowest thresholds the held-out bounds still hold at (chosen with the operating point,
    ops/training/pair_model/tuning.py): evidence may lower a threshold down to here, never below,
    so that what live traffic teaches cannot walk the cache into a region the tune files refute."""

    serve_cosine: float = 0.0
    agree: float = 0.0

    @classmethod
    def of(cls, info: dict) -> "Floor":
        try:
            return cls(**info.get("floor", {}))
        except TypeError:  # a pair model tuned before floors, or for another rule: no floor
            return cls()


def learn(observations: list[Observation], trained: OperatingPoint, delta: float, floor: Floor = Floor()) -> Learned:
    """The operating point the evidence supports (thresholds only move where it says so, and not
    below `floor`).

    `serve_cosine` is learned only where a lower one serves more: when the pair model's objection
    above it is no stricter than the band's `agree` below it. A point tuned with `objection` above
    `agree` (the pair model must be surer at high cosine, where PAWS-like look-alikes sit) is
    stricter above serve_cosine than below it, so moving serve_cosine down would refuse more and up
    would serve more: neither follows from "the answers served above v were right". It stays as
    trained (`why: fixed`), and only `agree` is learned, in the band below it."""
    if not trained.lower_serve_serves_more:
        serve, serve_why = trained.serve_cosine, "fixed"
    else:
        high = [o for o in observations if o.cosine >= trained.band_cosine
                and (o.score is None or o.score >= trained.objection)]
        serve, serve_why = lowest_safe(np.array([o.cosine for o in high]), np.array([not o.agreed for o in high]),
                                       delta, trained.serve_cosine)
        # The floor stops a threshold the evidence lowers; one it raises stays raised, even under a
        # floor that an operator's trained point (BRIGADE_CACHE_SERVE_COSINE) already sits below.
        lowest = min(floor.serve_cosine, trained.serve_cosine)
        if serve < lowest:
            serve, serve_why = lowest, "floor"
    serve = max(serve, trained.band_cosine)
    band = [o for o in observations if o.score is not None and trained.band_cosine <= o.cosine < serve]
    agree, agree_why = lowest_safe(np.array([o.score for o in band]), np.array([not o.agreed for o in band]),
                                   delta, trained.agree)
    lowest = min(floor.agree, trained.agree)
    if agree < lowest:
        agree, agree_why = lowest, "floor"
    return Learned(replace(trained, serve_cosine=round(serve, 6), agree=round(agree, 6)),
                   {"serve_cosine": serve_why, "agree": agree_why}, len(observations))


def served_error(observations: list[Observation]) -> dict:
    """The wrong-answer rate of served semantic hits, from audits (a random share of them) with its
    95% interval; feedback reports (wrong answers users noticed) counted beside it."""
    audits = [o for o in observations if o.source == "audit"]
    wrong = sum(not o.agreed for o in audits)
    lo, hi = wilson(wrong, len(audits))
    compared = [o for o in audits if o.same_as_model is not None]
    differs = sum(not o.same_as_model for o in compared)
    return {"audited": len(audits), "wrong": wrong, "rate": round(wrong / len(audits), 4) if audits else None,
            "interval_95": [round(lo, 4), round(hi, 4)],
            # Not an error rate: how often the model itself would have answered otherwise (docs/cache.md).
            "differs_from_model": {"compared": len(compared), "differs": differs,
                                   "rate": round(differs / len(compared), 4) if compared else None},
            "reported_wrong": sum(o.source == "feedback" for o in observations)}


def same_text(a: str, b: str) -> bool:
    return " ".join(a.lower().split()) == " ".join(b.lower().split())


def fit_drop(v_asked: np.ndarray, v_stored: np.ndarray, v_answer: np.ndarray) -> float:
    """The judge's measure: how much less an answer's embedding is about the asked question than
    about the question it was stored for (cosines; a fitting answer's is at most the margin)."""
    return float(np.dot(v_stored, v_answer)) - float(np.dot(v_asked, v_answer))


@dataclass(frozen=True)
class Verdict:
    fits: bool  # the judge's: what an observation's `agreed` records
    same_as_model: bool | None  # the model's own answer agreed with the stored one (None: none given)


def judge(asked: str, stored: str, answer: str, model_answer: str | None, embedder, margin: float,
          agreement: float) -> Verdict:
    """Whether `answer` (stored for the question `stored`) fits the question `asked`: its
    embedding's cosine with `asked` at most `margin` below its cosine with `stored`. It compares one
    answer with two questions, so an answer's style and length cancel out. Measured on the tune
    split with the default model's answers (docs/cache.md): margin 0.15 reads 0.9% of generated
    rewordings and 5% of hand-written ones as not fitting, and 72% of entity look-alikes, 36% of
    number ones; none whose question changed only direction, roles or word order.

    With the model's own answer to `asked`, also whether it agreed with `answer`: equal text up to
    case and spacing, or embeddings' cosine at `agreement` or above. One embedding call for both."""
    vectors = embedder.embed([asked, stored, answer] + ([model_answer] if model_answer is not None else []))
    fits = same_text(asked, stored) or fit_drop(*vectors[:3]) <= margin
    if model_answer is None:
        return Verdict(fits, None)
    same = same_text(answer, model_answer) or (bool(answer.strip() and model_answer.strip())
                                              and float(np.dot(vectors[2], vectors[3])) >= agreement)
    return Verdict(fits, same)
