"""`brigade cache eval --judge`: how well the evidence's judge tells a stored answer that fits an
asked question from one that does not. Offline.

The judge (cache/evidence.judge) reads a stored answer as fitting the asked question when the
answer's embedding cosine with the asked question is at most a margin below its cosine with the
question it was stored for. Every audit and near miss is judged so, and the thresholds learn from
the verdicts, so two rates matter:
- rewordings read as not fitting (false alarms): each one pushes the thresholds up for nothing,
  and a rate above `cache_max_error` alone keeps the audited error over its bound;
- look-alikes read as not fitting (the judge's power), by kind: a kind it cannot see is bounded
  only offline, by the held-out bounds the trained point and its floor were chosen with.

Input: labelled pairs whose q1 carries the model's answer (`python -m ops.training.pair_model.answer_pairs`, as for
`--paraphrases`). Each rate comes with its one-sided 95% upper bound (bounds.py), and the report
gives the margin at which a share (`keep`) of the rewordings read as fitting: the margin the
setting's default was chosen at, on the tune files.
"""
from __future__ import annotations

import numpy as np

from cache.evidence import fit_drop, same_text
from ops.core.percentiles import percentile
from ops.training.pair_model.bounds import upper_bound
from ops.training.pair_model.pairs import Pair


def drops(pairs: list[Pair], embedder) -> np.ndarray:
    """Per pair: the answer's cosine with q1 (its own question) minus its cosine with q2 (the asked
    one, cache/evidence.fit_drop); the judge reads it as fitting when this is at most the margin
    (equal texts always fit)."""
    texts = sorted({t for p in pairs for t in (p.q1, p.q2, p.answer)})
    vectors = dict(zip(texts, embedder.embed(texts)))
    return np.array([-np.inf if same_text(p.q2, p.q1) else fit_drop(vectors[p.q2], vectors[p.q1], vectors[p.answer])
                     for p in pairs])


def kind_of(pair: Pair) -> str:
    """A generated pair's kind (chat_adversaries.py); "any" in a file without kinds."""
    return pair.kind or "any"


def report(pairs: list[Pair], embedder, margin: float, keep: float = 0.99) -> dict:
    """Per kind: pairs, those read as not fitting at `margin` with the rate's upper bound; and the
    margin at which `keep` of the rewordings fit."""
    missing = sum(p.answer is None for p in pairs)
    if missing:
        raise ValueError(f"{missing} pairs carry no answer for q1: give the file the model's answers first "
                         "(python -m ops.training.pair_model.answer_pairs IN.jsonl OUT.jsonl)")
    d = drops(pairs, embedder)
    kinds: dict[str, list[int]] = {}
    for i, p in enumerate(pairs):
        kinds.setdefault(("rewordings:" if p.duplicate else "lookalikes:") + kind_of(p), []).append(i)
    by_kind = {}
    for name, rows in sorted(kinds.items()):
        misfits = int((d[rows] > margin).sum())
        by_kind[name] = {"pairs": len(rows), "not_fitting": misfits, "rate": round(misfits / len(rows), 4),
                         "upper95": round(upper_bound(misfits, len(rows)), 4)}
    rewordings = d[[i for i, p in enumerate(pairs) if p.duplicate]]
    lookalikes = d[[i for i, p in enumerate(pairs) if not p.duplicate]]

    def rate(values: np.ndarray) -> dict:
        misfits = int((values > margin).sum())
        return {"pairs": len(values), "not_fitting": misfits,
                "rate": round(misfits / len(values), 4) if len(values) else None,
                "upper95": round(upper_bound(misfits, len(values)), 4)}

    finite = rewordings[np.isfinite(rewordings)]
    keeping = round(percentile(finite, 100 * keep), 4) if len(finite) else None
    return {"margin": margin, "rewordings_false_alarms": rate(rewordings), "lookalikes_caught": rate(lookalikes),
            "by_kind": by_kind, f"margin_keeping_{keep:g}_of_rewordings": keeping}
