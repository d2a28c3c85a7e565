"""`brigade cache eval`: precision and recall of semantic hits on labelled pairs.

Every q1 is stored in a throwaway namespace through the real cache (Redis, FAISS), every q2 is
looked up through the same judgement a live lookup uses (embedding, FAISS neighbours, guards,
verifier). A hit is correct only when a duplicate pair's q2 returns that pair's own q1 entry
(an entry with the same question text); every other hit is a false hit.
"""
from __future__ import annotations

import uuid
from dataclasses import dataclass

import numpy as np

from cache.answer_cache import AnswerCache
from cache.pairs import Pair
from cache.query import CacheQuery

SWEEP = [0.3, 0.4, 0.5, 0.6, 0.7, 0.75, 0.8, 0.85, 0.9, 0.95, 0.98]


@dataclass
class Outcome:
    """The best candidate that no guard vetoed, for one looked-up q2."""

    score: float  # -1 when there was none
    correct: bool
    runner_up: float = -1.0  # the next unvetoed candidate's score (the ambiguity rule looks at it)
    duplicate: bool = False  # the pair's label


def metrics(outcomes: list[Outcome], pairs: list[Pair], threshold: float, ambiguity: float = 1.01) -> dict:
    hits = [o for o in outcomes if o.score >= threshold and o.runner_up < ambiguity]
    correct = sum(o.correct for o in hits)
    duplicates = sum(p.duplicate for p in pairs)
    precision = correct / len(hits) if hits else 1.0
    recall = correct / duplicates if duplicates else 0.0
    f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
    return {
        "threshold": threshold, "precision": round(precision, 4), "recall": round(recall, 4), "f1": round(f1, 4),
        "false_hit_rate": round((len(hits) - correct) / len(pairs), 4) if pairs else 0.0,
        "hits": len(hits), "n_pairs": len(pairs), "ambiguity": ambiguity,
        # Where the false hits come from: a duplicate's q2 served another stored question (often an
        # equally good rewording), or a pair labelled different.
        "false_hits_on_duplicates": sum(o.duplicate and not o.correct for o in hits),
        "false_hits_on_non_duplicates": sum(not o.duplicate for o in hits),
    }


async def outcomes_for(cache: AnswerCache, pairs: list[Pair], vectors: dict[str, np.ndarray] | None = None) -> list[Outcome]:
    """Store every q1, look up every q2; the namespace is removed afterwards."""
    namespace = "eval-" + uuid.uuid4().hex[:12]
    if vectors is None:
        texts = sorted({p.q1 for p in pairs} | {p.q2 for p in pairs})
        vectors = dict(zip(texts, cache.embedder.embed(texts)))

    def query(question: str) -> CacheQuery:
        return CacheQuery(exact_key=f"{namespace}:{question}", namespace=namespace, question=question,
                          storable=True, mode="auto", threshold=-1.0)

    try:
        stored = set()
        for p in pairs:
            if p.q1 not in stored:
                stored.add(p.q1)
                await cache.insert(query(p.q1), vectors[p.q1], ["(eval)"], "stop", 0, 1)
        out = []
        for p in pairs:
            judgements = sorted((j for j in cache.judge(query(p.q2), vectors[p.q2]) if not j.vetoes),
                                key=lambda j: j.value, reverse=True)
            if not judgements:
                out.append(Outcome(-1.0, False, duplicate=p.duplicate))
                continue
            best = judgements[0]
            runner_up = judgements[1].value if len(judgements) > 1 else -1.0
            out.append(Outcome(best.value, p.duplicate and best.neighbour.question == p.q1, runner_up, p.duplicate))
        return out
    finally:
        await cache.store.clear(namespace)
        cache.indexes.pop(namespace, None)


async def evaluate(cache: AnswerCache, pairs: list[Pair], thresholds: list[float] = SWEEP) -> dict:
    outcomes = await outcomes_for(cache, pairs)
    return {
        "default": metrics(outcomes, pairs, cache.threshold, cache.ambiguity),
        "sweep": [metrics(outcomes, pairs, t, cache.ambiguity) for t in thresholds],
        "verifier": cache.verifier is not None,
    }
