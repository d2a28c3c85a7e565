"""The models `/v1/rerank` and `/v1/score` score with, by the name a request gives.

- The reranker, `brigade-pair-model` (the default): the answer cache's pair model
  (cache/pair_model.py), a cross-encoder that reads the query and a document together; its score is
  its probability that the two ask the same thing. `brigade bench rerank` chose it
  (docs/bench-rerank.json): it put the true match first more often than the embedding model's
  cosine where neither model had seen the data and the distractors favoured neither
  (docs/doors.md, "Rerank and score").
- The embedding model (`all-MiniLM-L6-v2`), as vLLM scores with an embedding model: the cosine of
  the two texts' vectors, each embedded once per request.

Both are the cache's own instances, which its lookups use too, one forward pass at a time: a
request is scored in passes of BRIGADE_RERANK_BATCH_PAIRS pairs (or texts), so that a lookup waits
for one pass, not for a whole large request. A gateway without the cache holds neither.
"""
from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Protocol

import numpy as np

from cache.pair_model import MAX_TOKENS
from gateway.doors.held_models import embedding_model_name
from gateway.request import ProtocolError
from ops.core.settings import CacheSettings, Settings

if TYPE_CHECKING:
    from cache.embedder import Embedder
    from cache.pair_model import PairModel

RERANKER_NAME = "brigade-pair-model"


def reranker_name(settings: CacheSettings) -> str:
    """The shipped pair model's name, or the file stem of BRIGADE_CACHE_PAIR_MODEL's."""
    return Path(settings.cache_pair_model).stem if settings.cache_pair_model else RERANKER_NAME


class Scorer(Protocol):
    name: str

    def score(self, firsts: list[str], seconds: list[str]) -> tuple[list[float], int]:
        """Each pair's score, and the word pieces the model read (the request's usage)."""


class PairScorer:
    def __init__(self, name: str, pair_model: "PairModel", batch: int):
        self.name, self.pair_model, self.batch = name, pair_model, batch

    def score(self, firsts: list[str], seconds: list[str]) -> tuple[list[float], int]:
        scores: list[float] = []
        for i in range(0, len(firsts), self.batch):
            scores += self.pair_model.score_pairs(firsts[i:i + self.batch], seconds[i:i + self.batch]).tolist()
        return scores, sum(self.pair_model.token_counts(firsts, seconds))


class CosineScorer:
    def __init__(self, name: str, embedder: "Embedder", batch: int):
        self.name, self.embedder, self.batch = name, embedder, batch

    def score(self, firsts: list[str], seconds: list[str]) -> tuple[list[float], int]:
        texts = list(dict.fromkeys(firsts + seconds))  # a query ranked against many is embedded once
        vectors = np.concatenate([self.embedder.embed(texts[i:i + self.batch])
                                  for i in range(0, len(texts), self.batch)])
        at = dict(zip(texts, vectors))  # unit length: the dot product is the cosine
        return [float(at[a] @ at[b]) for a, b in zip(firsts, seconds)], sum(self.embedder.token_counts(texts))


class ScoringModels:
    def __init__(self, settings: Settings):
        self.settings = settings
        self.reranker = reranker_name(settings)
        self.embedding = embedding_model_name(settings)
        self.pair_model: PairModel | None = None
        self.embedder: Embedder | None = None
        self.loaded = False  # the cache has loaded (a gateway without it never does)

    def use(self, embedder: "Embedder", pair_model: "PairModel | None") -> None:
        self.embedder, self.pair_model, self.loaded = embedder, pair_model, True

    def choose(self, model: str | None) -> Scorer:
        """The scorer a request's `model` names (absent: the reranker); model_not_found or unavailable."""
        model = model or self.reranker
        batch = self.settings.rerank_batch_pairs
        if model not in (self.reranker, self.embedding, f"sentence-transformers/{self.embedding}"):
            raise ProtocolError("model_not_found", f"the model {model[:64]!r} does not score pairs; models: "
                                f"{self.reranker} (the default), {self.embedding}", None, "model")
        if not self.loaded:
            raise ProtocolError("unavailable", "this gateway runs without the answer cache, whose models serve "
                                "/v1/rerank and /v1/score: start it with BRIGADE_CACHE_ENABLED=true", None, "model")
        if model != self.reranker:
            return CosineScorer(self.embedding, self.embedder, batch)
        if self.pair_model is None:
            raise ProtocolError("unavailable", f"{self.reranker} is not loaded here (BRIGADE_CACHE_VERIFIER=false, "
                                "or its weights failed to load: the log says event=pair_model_unavailable); "
                                f"{self.embedding} scores by cosine", None, "model")
        return PairScorer(self.reranker, self.pair_model, batch)

    def card(self) -> dict | None:
        """The reranker's `GET /v1/models` card, once its model is loaded."""
        if self.pair_model is None:
            return None
        return {"id": self.reranker, "kind": "rerank", "max_model_len": MAX_TOKENS,
                "endpoints": ["/v1/rerank", "/rerank", "/v2/rerank", "/v1/score", "/score"]}
