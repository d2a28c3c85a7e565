"""`brigade bench vetoes` (formerly `guards`): how often the cache's lexical vetoes (cache/vetoes.py) refuse, on labelled
question pairs. Offline: no Redis, no model.

On pairs that mean the same (`"duplicate": true`) a veto is a rewording refused; on pairs that
mean something else it is a look-alike caught. With --generated, look-alikes made from the first
file's questions by ops/training/pair_model/lookalikes.py are counted too, by the kind of change.
Each count is split by guard (one pair may be vetoed by several).
"""
from __future__ import annotations

from collections import Counter
from pathlib import Path

from cache.vetoes import conflicts
from ops.training.pair_model.lookalikes import generate
from ops.training.pair_model.pairs import read_pairs

GENERATED_FROM = 2000  # questions the generated look-alikes are made from
GENERATED_SEED = 0


def vetoes(pairs: list[tuple[str, str]]) -> dict:
    """The share of `pairs` that some guard vetoes, and how many each guard vetoes."""
    by_guard: Counter[str] = Counter()
    vetoed = 0
    for question, candidate in pairs:
        names = conflicts(question, candidate)
        vetoed += bool(names)
        by_guard.update(names)
    return {"pairs": len(pairs), "vetoed": vetoed, "share": round(vetoed / len(pairs), 4) if pairs else None,
            "by_guard": dict(by_guard.most_common())}


def run(paths: list[str], limit: int | None = None, generated: int = 0) -> dict:
    """Per file: vetoes on its pairs that mean the same and on those that mean something else
    (the first `limit` of each); then, when asked, on `generated` generated look-alikes."""
    report: dict = {}
    for path in paths:
        pairs = read_pairs(path)
        same = [(p.q1, p.q2) for p in pairs if p.duplicate][:limit]
        other = [(p.q1, p.q2) for p in pairs if not p.duplicate][:limit]
        report[Path(path).name] = {"same_meaning": vetoes(same), "other_meaning": vetoes(other)}
    if generated and paths:
        questions = sorted({p.q1 for p in read_pairs(paths[0])})[:GENERATED_FROM]
        made = [p for p in generate(questions, generated, 0, seed=GENERATED_SEED) if not p.duplicate]
        report["generated_lookalikes"] = {kind: vetoes([(p.q1, p.q2) for p in made if p.kind == kind])
                                          for kind in sorted({p.kind for p in made})}
    return report
