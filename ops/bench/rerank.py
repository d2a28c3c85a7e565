"""`brigade bench rerank`: which of Brigade's two text models ranks a true match first more often.

Brigade holds two models that can score a query against documents: the answer cache's embedding
model (all-MiniLM-L6-v2: the cosine of two vectors computed apart) and its pair model (a
cross-encoder on the same layers that reads both texts at once, cache/pair_model.py). `/v1/rerank`
and `/v1/score` serve one of them; this measurement is how it is chosen.

The task, from labelled question pairs (`{"q1", "q2", "duplicate"}` per line): each query is the
q1 of a duplicate pair; its candidates are its q2 (the true match), the q2s labelled as *not* its
duplicates, and then the nearest other questions, `distractors` in all; a model ranks the
candidates and is right when the true match comes first. Reported per model: top-1 accuracy, mean
reciprocal rank, and the time to score one query's candidates as a request would (the embedding
model embeds the query and every candidate; the pair model reads each (query, candidate) pair), on
the gateway's thread count. Two sets:
- `qqp`: the given file (Quora Question Pairs), held out from the pair model: queries are
  duplicates of its test split (ops/training/pair_model/pairs.py), and no text of the measurement
  (query, match or distractor) appears in a train-split pair, the pairs the pair model was trained
  on. The embedding model's authors trained it on Quora duplicates among other data, probably
  these, so its figures here are optimistic.
- `chat`: Brigade's hand-written chat pairs, the tune and test files (ops/data/README.md): each
  source question with a rewording (the match) and a look-alike that shares most words but asks
  something else (a labelled distractor). Neither model was trained on them (the tune file only
  chose the cache's thresholds, which ranking does not use).

Distractors beyond the labelled ones are chosen two ways from a pool of held-out questions:
`lexical`, the nearest by TF-IDF cosine over words (a measure that is neither model, so the
choice favours neither), and `embedding`, the nearest by the embedding model (a reranker's usual
input: what an embedding search returns; hard for the embedding model by construction). Every
question labelled a duplicate of the query, directly or through other duplicate labels, is left
out, and so is any with the same words as the query or its match. Unlabelled duplicates may
remain; they count against both models alike. A tie with the true match counts against the model.
"""
from __future__ import annotations

import math
import random
import re
import statistics
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np

from ops.core.percentiles import percentile
from ops.training.pair_model.pairs import HAND_TEST, HAND_TUNE, Pair, duplicate_groups, read_pairs, split_of

POOLS = ("lexical", "embedding")
# The model is chosen on the chat set's lexical pool: neither model was trained on those pairs and
# its distractors favour neither; QQP is reported beside it, but the embedding model has seen it.
CHOSEN_ON = ("chat", "lexical")


@dataclass(frozen=True)
class Source:
    """A query, its true match and the texts labelled as meaning something else."""

    query: str
    match: str
    unlike: tuple[str, ...]


@dataclass(frozen=True)
class RankingQuery:
    query: str
    candidates: list[str]  # the true match first, then the distractors: labelled ones, then nearest first


@dataclass(frozen=True)
class LabelledSet:
    """The sources that can be queries, the questions distractors are drawn from, and every pair
    (for the duplicate groups)."""

    sources: list[Source]
    pool: list[str]
    pairs: list[Pair]


def sources_of(pairs: list[Pair], queries: list[Pair]) -> list[Source]:
    """Each duplicate pair of `queries` as a source; its unlike texts are the other sides of the
    non-duplicate pairs of `pairs` that its q1 is in."""
    unlike: dict[str, list[str]] = {}
    for p in pairs:
        if not p.duplicate:
            unlike.setdefault(p.q1, []).append(p.q2)
            unlike.setdefault(p.q2, []).append(p.q1)
    return [Source(p.q1, p.q2, tuple(t for t in unlike.get(p.q1, ()) if t != p.q2)) for p in queries if p.duplicate]


def qqp_set(pairs: list[Pair]) -> LabelledSet:
    """Duplicates of the test split and questions of the tune and test splits, none of them in a
    train-split pair."""
    trained = {text for p in pairs if split_of(p) == "train" for text in (p.q1, p.q2)}
    held = [p for p in pairs if split_of(p) != "train" and p.q1 not in trained and p.q2 not in trained]
    queries = [p for p in held if split_of(p) == "test"]
    pool = sorted({text for p in held for text in (p.q1, p.q2)})
    return LabelledSet(sources_of(held, queries), pool, pairs)


def chat_set(paths: tuple[str, ...] = (HAND_TUNE, HAND_TEST)) -> LabelledSet:
    pairs = [p for path in paths for p in read_pairs(path)]
    return LabelledSet(sources_of(pairs, pairs), sorted({text for p in pairs for text in (p.q1, p.q2)}), pairs)


def _words(text: str) -> str:
    return " ".join(re.findall(r"\w+", text.lower()))


def lexical_similarity(queries: list[str], pool: list[str]) -> np.ndarray:
    """TF-IDF cosine over words, queries x pool (sublinear term counts, fitted on both)."""
    from sklearn.feature_extraction.text import TfidfVectorizer

    vectorizer = TfidfVectorizer(lowercase=True, sublinear_tf=True).fit(pool + queries)
    return (vectorizer.transform(queries) @ vectorizer.transform(pool).T).toarray().astype(np.float32)


def build_queries(sources: list[Source], pool: list[str], similarity: np.ndarray, groups: dict[str, int],
                  distractors: int) -> list[RankingQuery]:
    """Each source's query with its match, its labelled unlike texts, and then the pool questions
    nearest to the query by `similarity` (one row per source), `distractors` in all, leaving out
    the query's duplicate group and the query's or match's words."""
    out = []
    for row, s in zip(similarity, sources):
        group = groups.get(s.query)
        same_words = {_words(s.query), _words(s.match)}
        chosen = list(dict.fromkeys(s.unlike))[:distractors]
        for j in np.argsort(-row, kind="stable"):
            if len(chosen) >= distractors:
                break
            text = pool[j]
            if text in (s.query, s.match) or text in chosen or _words(text) in same_words \
                    or (group is not None and groups.get(text) == group):
                continue
            chosen.append(text)
        out.append(RankingQuery(s.query, [s.match, *chosen]))
    return out


def rank_of_true(scores: np.ndarray) -> int:
    """The true match's rank (1 = first), candidate 0; ties rank it below the others."""
    return 1 + int(np.sum(scores[1:] >= scores[0]))


@dataclass
class Ranked:
    ranks: list[int]
    ms: list[float]  # per timed query

    def report(self) -> dict:
        n = len(self.ranks)
        return {"queries": n, "top1": round(sum(r == 1 for r in self.ranks) / n, 4),
                "mrr": round(sum(1 / r for r in self.ranks) / n, 4),
                "mean_rank": round(sum(self.ranks) / n, 3),
                "ms_per_query": {"timed_queries": len(self.ms), "mean": round(statistics.fmean(self.ms), 1),
                                 "p50": round(statistics.median(self.ms), 1),
                                 "p90": round(percentile(self.ms, 90), 1)} if self.ms else None}


def paired(pair: Ranked, embedding: Ranked) -> dict:
    """Query by query: where one model put the true match first and the other did not, and how
    likely so lopsided a split of those queries would be if the two were equally good (McNemar's
    exact test: a two-sided binomial test on the queries only one got right)."""
    both = list(zip(pair.ranks, embedding.ranks))
    only_pair = sum(a == 1 and b != 1 for a, b in both)
    only_embedding = sum(a != 1 and b == 1 for a, b in both)
    return {"both_first": sum(a == 1 and b == 1 for a, b in both), "only_pair_model_first": only_pair,
            "only_embedding_model_first": only_embedding, "neither_first": sum(a != 1 and b != 1 for a, b in both),
            "exact_p": float(f"{sign_test(only_pair, only_embedding):.3g}")}


def sign_test(wins: int, losses: int) -> float:
    """Two-sided exact binomial p-value of `wins` against `losses` at even odds."""
    n = wins + losses
    tail = sum(math.comb(n, k) for k in range(min(wins, losses) + 1)) / 2 ** n
    return min(1.0, 2 * tail)


def rank_with_pair_model(pair_model, queries: list[RankingQuery]) -> Ranked:
    """Each query's candidates scored as `/v1/rerank` would score them: one call per query, timed."""
    ranks, ms = [], []
    for q in queries:
        started = time.perf_counter()
        scores = pair_model.score(q.query, q.candidates)
        ms.append((time.perf_counter() - started) * 1000)
        ranks.append(rank_of_true(scores))
    return Ranked(ranks, ms)


def rank_with_embeddings(embedder, queries: list[RankingQuery], vectors: dict[str, np.ndarray],
                         timed: int) -> Ranked:
    """Cosines from vectors embedded once (in batches: padding moves only the last digits); the
    first `timed` queries are embedded again whole, query and candidates in one call, as a request
    would be, for the time."""
    ranks = [rank_of_true(np.array([float(vectors[q.query] @ vectors[c]) for c in q.candidates])) for q in queries]
    ms = []
    for q in queries[:timed]:
        started = time.perf_counter()
        rows = embedder.embed([q.query, *q.candidates])
        _ = rows[1:] @ rows[0]
        ms.append((time.perf_counter() - started) * 1000)
    return Ranked(ranks, ms)


@dataclass(frozen=True)
class RerankBench:
    pairs_file: str
    queries: int = 600  # drawn from the held-out QQP duplicates (the chat set is used whole)
    distractors: int = 9
    pool: int = 8000  # held-out QQP questions the distractors are chosen from
    seed: int = 0
    threads: int = 1
    timed: int = 100  # queries per pool the embedding model is timed on


def measure(labelled: LabelledSet, sources: list[Source], pool: list[str], bench: RerankBench, embedder,
            pair_model, vectors: dict[str, np.ndarray]) -> dict:
    """Both models on both pools of one set."""
    groups = duplicate_groups(labelled.pairs)
    pool_vectors = np.stack([vectors[t] for t in pool])
    similarity = {"lexical": lexical_similarity([s.query for s in sources], pool),
                  "embedding": np.stack([vectors[s.query] for s in sources]) @ pool_vectors.T}
    out = {"queries": len(sources), "of": len(labelled.sources), "pool": len(pool),
           "with_labelled_distractors": sum(bool(s.unlike) for s in sources)}
    for name in POOLS:
        ranking = build_queries(sources, pool, similarity[name], groups, bench.distractors)
        pair = rank_with_pair_model(pair_model, ranking)
        embedding = rank_with_embeddings(embedder, ranking, vectors, bench.timed)
        out[name] = {"pair_model": pair.report(), "embedding_model": embedding.report(),
                     "paired": paired(pair, embedding),
                     "example": {"query": ranking[0].query, "match": ranking[0].candidates[0],
                                 "distractors": ranking[0].candidates[1:4]}}
    return out


def pair_model_file(settings) -> str:
    return Path(settings.cache_pair_model).name if settings.cache_pair_model else "cache/pair_model.safetensors"


def run(bench: RerankBench, settings, progress: Callable[[str], None] = lambda _: None) -> dict:
    import torch

    from cache.embedder import Embedder
    from cache.pair_model import PAIR_WEIGHTS, PairModel
    from gateway.doors.held_models import embedding_model_name

    torch.set_num_threads(bench.threads)
    rng = random.Random(bench.seed)
    qqp, chat = qqp_set(read_pairs(bench.pairs_file)), chat_set()
    qqp_sources = rng.sample(qqp.sources, min(bench.queries, len(qqp.sources)))
    qqp_pool = sorted(rng.sample(qqp.pool, min(bench.pool, len(qqp.pool))))
    progress(f"qqp: {len(qqp_sources)} queries of {len(qqp.sources)} held-out duplicates, a pool of {len(qqp_pool)}; "
             f"chat: {len(chat.sources)} queries, a pool of {len(chat.pool)}")

    embedder = Embedder(settings.embedding_model or None, threads=bench.threads)
    pair_model = PairModel.load(Path(settings.cache_pair_model) if settings.cache_pair_model else PAIR_WEIGHTS,
                                threads=bench.threads)
    texts = sorted(set(qqp_pool) | set(chat.pool) | {t for s in qqp_sources for t in (s.query, s.match, *s.unlike)})
    started = time.perf_counter()
    vectors = dict(zip(texts, embedder.embed(texts, batch_size=128)))
    progress(f"embedded {len(texts)} texts in {time.perf_counter() - started:.0f} s")

    sets = {}
    for name, labelled, sources, pool in (("chat", chat, chat.sources, chat.pool),
                                          ("qqp", qqp, qqp_sources, qqp_pool)):
        sets[name] = measure(labelled, sources, pool, bench, embedder, pair_model, vectors)
        for pool_name in POOLS:
            r = sets[name][pool_name]
            progress(f"{name}, {pool_name} distractors: top-1 pair model {r['pair_model']['top1']}, "
                     f"embedding model {r['embedding_model']['top1']}")

    judged = sets[CHOSEN_ON[0]][CHOSEN_ON[1]]
    better = "pair_model" if judged["pair_model"]["top1"] > judged["embedding_model"]["top1"] else "embedding_model"
    return {
        "task": "each query a labelled duplicate's q1; candidates its q2 (the true match), the texts labelled as "
                "not its duplicates, then the nearest other held-out questions; right when the true match ranks "
                "first (ties count against)",
        "sets": {"chat": "ops/data/chat_pairs_tune.jsonl and chat_pairs_test.jsonl: hand-written rewordings and "
                         "look-alikes (one labelled look-alike per query), never trained on by either model",
                 "qqp": f"{Path(bench.pairs_file).name}: test-split duplicates, no text in any train-split pair "
                        "(what the pair model was trained on); the embedding model was trained on Quora duplicates"},
        "pools": {"lexical": "nearest to the query by TF-IDF cosine over words (favours neither model)",
                  "embedding": "nearest to the query by the embedding model's cosine (an embedding search's "
                               "results, as a reranker gets them; hard for the embedding model by construction)"},
        "config": {"qqp_queries": len(qqp_sources), "distractors": bench.distractors, "qqp_pool": len(qqp_pool),
                   "seed": bench.seed, "threads": bench.threads, "timed_embedding_queries": bench.timed},
        "models": {"embedding_model": embedding_model_name(settings), "pair_model": pair_model_file(settings),
                   "pair_model_info": {k: pair_model.info.get(k) for k in ("steps", "examples", "seed")}},
        "results": sets,
        "better": better,
        "chosen_on": f"top-1 accuracy, {CHOSEN_ON[0]} set, {CHOSEN_ON[1]} distractors",
    }
