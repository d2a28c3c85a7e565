"""What `brigade bench cache-replay` asks, and how it judges what came back.

The workload is made from labelled pairs (`{"q1", "q2", "duplicate"}`): every distinct q1 is a
*source*, answered once before the replay (the fill); the replay mixes exact repeats of the
sources, the rewordings (q2 of a duplicate pair) and the look-alikes (q2 of a pair that means
something else), shuffled with a fixed seed.

A reply is judged by its text, never by cache entry ids: each question belongs to a *family*
(a repeat or a rewording to its source's; a look-alike to its own text, since it means something
else), and a family's answers are the texts the model itself gave its members (the fill's answer
to the source, and any member answered afresh in the replay or served as an exact hit, which is
the same request answered before). A hit is right when the text served is one of its own family's
answers, wrong otherwise: so an exact hit is right, a rewording served its source's answer is
right, and a look-alike served a stored answer is wrong unless the model had given its own
question that very text.

Pure: pairs and seeds in, plans and numbers out; nothing here opens a socket.
"""
from __future__ import annotations

import random
from collections import Counter
from dataclasses import dataclass

from ops.bench.quality_questions import wilson_interval
from ops.core.percentiles import percentile
from ops.training.pair_model.pairs import Pair

KINDS = ("repeat", "rewording", "lookalike")


@dataclass(frozen=True)
class Ask:
    index: int
    kind: str  # repeat | rewording | lookalike
    question: str
    source: str  # the q1 it was made from

    @property
    def family(self) -> str:
        """Whose answers are right for it: the source's for the same meaning, its own text's for a look-alike."""
        return self.question if self.kind == "lookalike" else self.source


@dataclass
class Reply:
    """One answer as the client saw it. Times in seconds from the request's send."""

    text: str = ""
    cached: str | None = None  # exact | semantic: served from the cache
    similarity: float | None = None
    entry: str | None = None
    finish_reason: str | None = None
    completion_tokens: int = 0  # the usage the gateway reports (a hit: the stored answer's)
    ttft_s: float | None = None
    e2e_s: float | None = None
    error: str | None = None  # a stable code when the request failed

    @property
    def ok(self) -> bool:
        return self.error is None


@dataclass
class Judged:
    ask: Ask
    reply: Reply
    verdict: str | None = None  # right | wrong for a hit; None for a miss or a failure
    served_family: str | None = None  # whose answer a wrong hit was, when it is known

    def to_json(self) -> dict:
        r = self.reply
        return {"index": self.ask.index, "kind": self.ask.kind, "asked": self.ask.question, "source": self.ask.source,
                "cached": r.cached, "similarity": r.similarity, "entry": r.entry, "verdict": self.verdict,
                "finish_reason": r.finish_reason, "completion_tokens": r.completion_tokens,
                "ttft_s": _round(r.ttft_s), "e2e_s": _round(r.e2e_s), "error": r.error}


# ---- the workload ---------------------------------------------------------------------------------


def sources_of(pairs: list[Pair]) -> list[str]:
    """The distinct q1s, in file order."""
    return list(dict.fromkeys(p.q1 for p in pairs))


def plan_replay(pairs: list[Pair], repeat_ratio: float, seed: int) -> list[Ask]:
    """Every q2 once (a rewording or a look-alike), and exact repeats of the sources making
    `repeat_ratio` of the whole, spread evenly over the sources; shuffled by `seed`."""
    if not 0 <= repeat_ratio < 1:
        raise ValueError("--repeat-ratio is a share of the workload: from 0 up to (not including) 1")
    rng = random.Random(seed)
    asks = [Ask(0, "rewording" if p.duplicate else "lookalike", p.q2, p.q1) for p in pairs]
    sources = sources_of(pairs)
    repeats = round(repeat_ratio * len(asks) / (1 - repeat_ratio)) if sources else 0
    order: list[str] = []
    while len(order) < repeats:  # each source once before any twice
        cycle = sources[:]
        rng.shuffle(cycle)
        order += cycle
    asks += [Ask(0, "repeat", s, s) for s in order[:repeats]]
    rng.shuffle(asks)
    return [Ask(i, a.kind, a.question, a.source) for i, a in enumerate(asks)]


# ---- judging --------------------------------------------------------------------------------------


def own_answer(reply: Reply) -> bool:
    """The model's answer to the very question asked: generated now, or an exact hit (the same
    request, word for word, answered before: a repeat, or a question a previous run stored)."""
    return reply.ok and reply.cached in (None, "exact")


def family_answers(fill: dict[str, Reply], judged: list[Judged]) -> dict[str, set[str]]:
    """Each family's answers as the model gave them: the fill's, and the replay's own answers."""
    answers: dict[str, set[str]] = {}
    for source, reply in fill.items():  # asked with `cache: exact`: never a neighbour's answer
        if own_answer(reply):
            answers.setdefault(source, set()).add(reply.text)
    for j in judged:
        if own_answer(j.reply):
            answers.setdefault(j.ask.family, set()).add(j.reply.text)
    return answers


def judge(fill: dict[str, Reply], replies: list[tuple[Ask, Reply]]) -> list[Judged]:
    """Every hit right or wrong, by the text it served (module docstring)."""
    judged = [Judged(ask, reply) for ask, reply in replies]
    answers = family_answers(fill, judged)
    owner: dict[str, str] = {}  # an answer's text -> a family that was given it
    for family, texts in answers.items():
        for text in texts:
            owner.setdefault(text, family)
    for j in judged:
        if not j.reply.ok or not j.reply.cached:
            continue
        if j.reply.text in answers.get(j.ask.family, ()):
            j.verdict = "right"
        else:
            j.verdict, j.served_family = "wrong", owner.get(j.reply.text)
    return judged


# ---- the report -----------------------------------------------------------------------------------


def share(count: int, total: int) -> dict:
    """A proportion with its 95% Wilson interval."""
    lo, hi = wilson_interval(count, total)
    return {"count": count, "of": total, "value": round(count / total, 4) if total else None,
            "wilson95": [round(lo, 4), round(hi, 4)]}


def _round(value: float | None, digits: int = 6) -> float | None:
    return None if value is None else round(value, digits)


def _ms(values: list[float], q: float) -> float | None:
    return round(percentile(values, q) * 1000, 3) if values else None


def summarize(judged: list[Judged]) -> dict:
    """Per kind and overall: hits, right and wrong, recall, the compute saved, hit and miss latency."""
    by_kind = {}
    for kind in KINDS:
        rows = [j for j in judged if j.ask.kind == kind]
        ok = [j for j in rows if j.reply.ok]
        layers = Counter(j.reply.cached for j in ok if j.reply.cached)
        hits = sum(layers.values())
        by_kind[kind] = {"requests": len(rows), "hits": hits, "exact": layers["exact"], "semantic": layers["semantic"],
                         "right": sum(j.verdict == "right" for j in rows),
                         "wrong": sum(j.verdict == "wrong" for j in rows), "misses": len(ok) - hits,
                         "errors": len(rows) - len(ok)}
    ok = [j for j in judged if j.reply.ok]
    hits = [j for j in ok if j.reply.cached]
    wrong = [j for j in hits if j.verdict == "wrong"]
    misses = [j for j in ok if not j.reply.cached]
    tokens = sum(j.reply.completion_tokens for j in ok)
    hit_tokens = sum(j.reply.completion_tokens for j in hits)
    right_tokens = sum(j.reply.completion_tokens for j in hits if j.verdict == "right")
    miss_e2e = [j.reply.e2e_s for j in misses if j.reply.e2e_s is not None]
    miss_ttft = [j.reply.ttft_s for j in misses if j.reply.ttft_s is not None]

    def hit_latency(layers: tuple[str, ...]) -> dict:
        e2e = [j.reply.e2e_s for j in hits if j.reply.cached in layers and j.reply.e2e_s is not None]
        return {"p50": _ms(e2e, 50), "p99": _ms(e2e, 99), "count": len(e2e)}
    k = by_kind
    return {
        "requests": len(judged), "answered": len(ok), "errors": dict(Counter(j.reply.error for j in judged
                                                                           if not j.reply.ok)),
        "by_kind": by_kind,
        "hit_rate": share(len(hits), len(ok)),
        "rewording_recall": share(k["rewording"]["right"], k["rewording"]["requests"] - k["rewording"]["errors"]),
        "lookalike_served": share(k["lookalike"]["hits"], k["lookalike"]["requests"] - k["lookalike"]["errors"]),
        "wrong_hit_rate": share(len(wrong), len(hits)),
        "wrong_share": share(len(wrong), len(ok)),
        # What a hit saved is the tokens of the answer it served: the usage the gateway reports with it.
        "compute_saved": {"hit_tokens": hit_tokens, "right_hit_tokens": right_tokens, "total_tokens": tokens,
                          "share": round(hit_tokens / tokens, 4) if tokens else None,
                          "right_share": round(right_tokens / tokens, 4) if tokens else None},
        # End to end as the client saw it, all from the replay: hits and misses met the same load.
        "latency_ms": {"hit": hit_latency(("exact", "semantic")), "exact_hit": hit_latency(("exact",)),
                       "semantic_hit": hit_latency(("semantic",)),
                       "miss": {"p50": _ms(miss_e2e, 50), "p99": _ms(miss_e2e, 99), "ttft_p50": _ms(miss_ttft, 50),
                                "count": len(miss_e2e)}},
        "wrong_hits": [{"kind": j.ask.kind, "asked": j.ask.question, "source": j.ask.source,
                        "served_answer_of": j.served_family, "cached": j.reply.cached,
                        "similarity": j.reply.similarity, "entry": j.reply.entry,
                        "served": j.reply.text[:120]} for j in wrong],
    }
