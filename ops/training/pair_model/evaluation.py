"""`brigade cache eval`: how often a semantic hit answers the question that was asked. Offline.

Every q1 of a labelled file is stored in an in-memory FAISS index, every q2 is looked up through
the same steps a live lookup takes (embedding, nearest stored questions above the cosine floor,
guards, the pair model, `hit_rule.choose`). No Redis and no gateway are needed.

Three kinds of file, three questions (strict counting throughout: a hit is correct only when a
q2 returns its own q1; a stored rewording labelled nowhere cannot be shown to be right):
- duplicates (QQP): precision and recall of hits; beside the strict precision, the precision by
  the file's own labels (`precision_by_labels`): a hit on another stored question also counts when
  the file's duplicate labels join it to the asked one, directly or through others, texts compared
  with case and punctuation folded. Quora asks the same question many times over, so a strict
  count calls wrong a hit on another stored copy of the question, even one of the same words;
  and, given a person's verdicts (`--verdicts`: one on each hit, keyed by `verdict_key`), the
  precision by reading (`precision_by_reading`) over the hits with a verdict, and how many had none.
  Quora's labels cover the pair asked, not every stored question a hit can land on, and a few of
  its "duplicate" labels join questions that ask different things; a reading judges both;
- look-alikes (PAWS): the share of look-ups whose pair means something else that were served a
  stored answer at all;
each wrong rate with its one-sided 95% upper bound beside it (bounds.py), and precision with its
lower bound: on a few hundred pairs the bound, not the rate, is what the next set can be expected
to stay under;
- paraphrases (every pair a rewording, like GPTCache's documentation benchmark): recall, and the
  share of look-ups served another entry's answer.

A pair that carries q1's answer and finish reason (ops/training/pair_model/answer_pairs.py) stores q1 only when the
live cache would make its answer servable to rewordings (`reusable_for_rewordings`); its q2 is
then a miss, as it would be live.
"""
from __future__ import annotations

import hashlib
import json
import re
import time
from dataclasses import dataclass, replace
from functools import partial

from cache.answer_cache import reusable_for_rewordings
from cache.hit_rule import Candidate, OperatingPoint, choose
from cache.index import Item, VectorIndex
from cache.store import answer_digest
from ops.core.percentiles import percentile
from ops.training.pair_model.bounds import upper_bound
from ops.training.pair_model.pairs import Pair, duplicate_groups

SWEEP = [0.8, 0.84, 0.86, 0.88, 0.9, 0.92, 0.94, 0.96, 0.98]  # serve_cosine, the rest as tuned


@dataclass
class Outcome:
    """One looked-up q2: its scored candidates, and which stored entry is its own q1."""

    candidates: list[Candidate]
    own_id: str
    duplicate: bool  # the pair's label
    kind: str | None = None  # a generated look-alike's kind (direction, negation, ...), when the file says
    words: int = 0  # the stored text's length in words (long statements are reported apart)
    asked: str = ""  # the q2 looked up

    def served(self, point: OperatingPoint) -> Candidate | None:
        return choose(self.candidates, point)


LONG_WORDS = 15  # a stored text this long or longer is a long statement


@dataclass
class Scored:
    outcomes: list[Outcome]
    decision_ms: list[float]  # embedding, search, guards and pair model, per look-up, as live
    stored: int = 0  # distinct q1 in the index (answers unfit for rewordings are left out)


def score_pairs(cache, pairs: list[Pair], point: OperatingPoint | None = None) -> Scored:
    """Store every distinct q1, look up every q2; the cache supplies embedder, verifier and settings.

    The decision is timed as it runs live at `point` (embedding the question, the nearest stored
    ones, the guards, the pair model on at most two proposals); then every other unvetoed
    candidate is scored too, so that any operating point can be replayed (`choose`) without
    asking the pair model again."""
    point = point or cache.operating_point or OperatingPoint()
    texts = sorted({p.q1 for p in pairs} | {p.q2 for p in pairs})
    vectors = dict(zip(texts, cache.embedder.embed(texts, batch_size=128)))
    index = VectorIndex(cache.embedder.dim, hnsw_from=cache.settings.cache_hnsw_from)
    ids: dict[str, str] = {}
    for p in pairs:
        if p.q1 not in ids:
            ids[p.q1] = str(len(ids))
            if p.answer is None or reusable_for_rewordings(p.answer, p.finish_reason or ""):
                # Unknown answers are all different ones: every other entry is a rival.
                digest = answer_digest(p.answer) if p.answer is not None else f"q1:{ids[p.q1]}"
                index.add(ids[p.q1], Item(vectors[p.q1], p.q1, digest))
    index.compact()
    outcomes, times = [], []
    for p in pairs:
        started = time.perf_counter()
        cache.embedder.embed_one(p.q2)  # timed as live: the asked question is embedded on the path
        candidates = cache.scored(p.q2, cache.candidates(index, p.q2, vectors[p.q2]), point)
        times.append((time.perf_counter() - started) * 1000)
        outcomes.append(Outcome(score_all(cache, p.q2, candidates), ids[p.q1], p.duplicate, p.kind, len(p.q1.split()),
                                p.q2))
    return Scored(outcomes, times, len(index))


def score_all(cache, question: str, candidates: list[Candidate]) -> list[Candidate]:
    """Every unvetoed candidate with the pair model's score (those already scored are kept)."""
    todo = [c for c in candidates if c.score is None and not c.vetoes]
    if cache.pair_model is None or not todo:
        return candidates
    scores = dict(zip((c.entry_id for c in todo), cache.pair_model.score(question, [c.question for c in todo]).tolist()))
    return [replace(c, score=scores[c.entry_id]) if c.entry_id in scores else c for c in candidates]


def folded(text: str) -> str:
    """A question as the precision by labels compares it: lower case, words and numbers only."""
    return " ".join(re.findall(r"[a-z0-9]+", text.lower()))


def _same_group(groups: dict[str, int], a: str, b: str) -> bool:
    a, b = folded(a), folded(b)
    return a == b or (a in groups and groups.get(a) == groups.get(b))


def verdict_key(asked: str, served: str) -> str:
    """A hit's name in a verdicts file: a digest of the two folded texts, so the file holds no text."""
    return hashlib.sha256(f"{folded(asked)}\t{folded(served)}".encode()).hexdigest()[:16]


def read_verdicts(path) -> dict[str, bool]:
    """A verdicts file: JSONL {"key": verdict_key(asked, served), "same": whether the served stored
    question's answer answers the asked one, "why": when not} (ops/data/README.md)."""
    with open(path, encoding="utf-8") as lines:
        return {row["key"]: bool(row["same"]) for row in map(json.loads, filter(str.strip, lines))}


def _precision(name: str, right: int, of: int) -> dict:
    return {name: round(right / of, 4), f"{name}_lower95": round(1 - upper_bound(of - right, of), 4)}


def duplicate_metrics(outcomes: list[Outcome], point: OperatingPoint, groups: dict[str, int] | None = None,
                      verdicts: dict[str, bool] | None = None) -> dict:
    """`groups` (pairs.duplicate_groups over folded texts) adds the precision by labels, `verdicts`
    (read_verdicts) the precision by reading; recall stays strict."""
    served = [(o, o.served(point)) for o in outcomes]
    hits = [(o, c) for o, c in served if c is not None]
    correct = sum(o.duplicate and c.entry_id == o.own_id for o, c in hits)
    beyond_strict = {}  # the precision by labels and by reading, when asked for
    if groups is not None and hits:
        # A hit on its own q1: the pair's own label decides. On another stored question: the groups.
        right = sum(o.duplicate if c.entry_id == o.own_id else _same_group(groups, c.question, o.asked)
                    for o, c in hits)
        beyond_strict = _precision("precision_by_labels", right, len(hits))
    if verdicts is not None:
        read = [verdicts[key] for o, c in hits if (key := verdict_key(o.asked, c.question)) in verdicts]
        beyond_strict["hits_without_verdict"] = len(hits) - len(read)
        if read:
            beyond_strict.update(_precision("precision_by_reading", sum(read), len(read)))
    duplicates = sum(o.duplicate for o in outcomes)
    precision = correct / len(hits) if hits else 1.0
    recall = correct / duplicates if duplicates else 0.0
    return {
        "precision": round(precision, 4), "recall": round(recall, 4), "hits": len(hits), "pairs": len(outcomes),
        # The precision the hits support with 95% confidence (one-sided; bounds.py).
        "precision_lower95": round(1 - upper_bound(len(hits) - correct, len(hits)), 4) if hits else None,
        # Where the false hits come from: a duplicate's q2 served another stored question (often an
        # equally good rewording), or a pair labelled different.
        "false_hits_on_duplicates": sum(o.duplicate and c.entry_id != o.own_id for o, c in hits),
        "false_hits_on_non_duplicates": sum(not o.duplicate for o, _ in hits),
        **beyond_strict,
    }


def lookalike_metrics(outcomes: list[Outcome], point: OperatingPoint) -> dict:
    different = [o for o in outcomes if not o.duplicate]
    same = [o for o in outcomes if o.duplicate]
    served_different = sum(o.served(point) is not None for o in different)
    own = sum((c := o.served(point)) is not None and c.entry_id == o.own_id for o in same)
    long_different = [o for o in different if o.words >= LONG_WORDS]
    long_same = [o for o in same if o.words >= LONG_WORDS]
    long_served = sum(o.served(point) is not None for o in long_different)
    long_own = sum((c := o.served(point)) is not None and c.entry_id == o.own_id for o in long_same)
    by_kind: dict[str, list[int]] = {}
    for o in different:
        if o.kind is not None:
            counts = by_kind.setdefault(o.kind, [0, 0])
            counts[0] += o.served(point) is not None
            counts[1] += 1
    return {
        # Each kind of look-alike on its own: a target must hold for every kind, not on average.
        **({"by_kind": {kind: {"served": k, "of": n, "rate": round(k / n, 4), "upper95": round(upper_bound(k, n), 4)}
                        for kind, (k, n) in sorted(by_kind.items())}} if by_kind else {}),
        "served_when_different": round(served_different / len(different), 4) if different else 0.0,
        "served_when_different_upper95": round(upper_bound(served_different, len(different)), 4),
        "different_lookups": len(different),
        "paraphrase_recall": round(own / len(same), 4) if same else 0.0,
        # Long statements (LONG_WORDS words or more) on their own: a pair model reading short
        # questions can score a long rewording down for its length alone.
        **({"long": {"rewordings": len(long_same), "recall": round(long_own / len(long_same), 4) if long_same else 0.0,
                     "lookalikes": len(long_different), "served_when_different":
                         round(long_served / len(long_different), 4) if long_different else 0.0,
                     "served_when_different_upper95": round(upper_bound(long_served, len(long_different)), 4)}}
           if long_same or long_different else {}),
    }


def paraphrase_metrics(outcomes: list[Outcome], point: OperatingPoint) -> dict:
    served = [(o, o.served(point)) for o in outcomes]
    correct = sum(c is not None and c.entry_id == o.own_id for o, c in served)
    wrong = sum(c is not None and c.entry_id != o.own_id for o, c in served)
    n = len(outcomes)
    return {"recall": round(correct / n, 4) if n else 0.0, "wrong": round(wrong / n, 4) if n else 0.0,
            "wrong_upper95": round(upper_bound(wrong, n), 4), "pairs": n}


def latency(ms: list[float]) -> dict:
    if not ms:
        return {"decision_ms_p50": None, "decision_ms_p99": None}
    return {"decision_ms_p50": round(percentile(ms, 50), 2), "decision_ms_p99": round(percentile(ms, 99), 2)}


METRICS = {"duplicates": duplicate_metrics, "lookalikes": lookalike_metrics, "paraphrases": paraphrase_metrics}


def evaluate(cache, files: dict[str, list[Pair]], labels: dict[str, list[Pair]] | None = None,
             verdicts: dict[str, bool] | None = None) -> dict:
    """`files` maps a kind (duplicates, lookalikes, paraphrases) to its pairs; `labels`, a kind to
    the pairs whose labels group its questions (the whole file, every split: by default the pairs
    evaluated); `verdicts`, a person's verdicts on the duplicates' hits (read_verdicts)."""
    point = cache.operating_point
    report: dict = {"semantic": cache.semantic_mode, "operating_point": point.__dict__ if point else None}
    for kind, pairs in files.items():
        scored = score_pairs(cache, pairs, point)
        measure = METRICS[kind]
        if kind == "duplicates":
            groups = duplicate_groups((labels or {}).get(kind, pairs), fold=folded)
            measure = partial(duplicate_metrics, groups=groups, verdicts=verdicts)
        section = {"default": measure(scored.outcomes, point) if point else None, "stored": scored.stored,
                   **latency(scored.decision_ms)}
        if point is not None:
            section["sweep"] = [{"serve_cosine": t, **measure(scored.outcomes, replace(point, serve_cosine=t).clamped())}
                                for t in SWEEP]
        report[kind] = section
    return report

