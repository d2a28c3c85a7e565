"""The semantic rule's thresholds: the trained numbers, then where the evidence moves them.

Two kinds, both from the observations every gateway keeps in one Redis list (cache/evidence.py):
- the operating point every lookup serves with: the trained one until `relearn` reads the whole
  list (at start and every sweep), then the one the evidence supports under `cache_max_error`;
  every gateway reads the same list, so every gateway serves with the same point;
- each entry's own bar: raised at once when an observation shows the entry's answer was wrong
  at some cosine (in Redis, on the shared log for the other gateways, and in this gateway's index).
"""
from __future__ import annotations

import logging

from redis.exceptions import RedisError

from cache.evidence import BAR_MARGIN, Floor, Learned, Observation, learn
from cache.hit_rule import OperatingPoint, point_from
from cache.local_indexes import LocalIndexes
from cache.pair_model import PairModel
from cache.store import EntryStore

log = logging.getLogger("brigade.cache")


def semantic_mode(pair_model: PairModel | None, fallback: str) -> str:
    """Who decides semantic hits: the pair model ("pair"), the cosine rule ("cosine", only when
    BRIGADE_CACHE_FALLBACK asks for it), or nobody ("off": exact hits only)."""
    return "pair" if pair_model is not None else fallback


def trained_point(pair_model: PairModel | None, settings) -> OperatingPoint | None:
    """The semantic rule's trained numbers (stored with the pair model; the cosine rule's without
    one), each overridable from settings; None when the semantic layer is off."""
    mode = semantic_mode(pair_model, settings.cache_fallback)
    if mode == "pair":
        return point_from(pair_model.info.get("operating_point", {}), settings)
    if mode == "cosine":
        serve = settings.cache_serve_cosine if settings.cache_serve_cosine is not None \
            else settings.cache_cosine_threshold
        return OperatingPoint(serve_cosine=serve, band_cosine=serve)
    return None


def trained_floor(pair_model: PairModel | None) -> Floor:
    """How low evidence may move the thresholds: stored with the pair model (none for the cosine rule)."""
    return Floor.of(pair_model.info) if pair_model is not None else Floor()


class Thresholds:
    def __init__(self, trained: OperatingPoint | None, max_error: float, store: EntryStore | None,
                 local: LocalIndexes, floor: Floor = Floor()):
        self.trained = trained  # replaced when the pair model is (ops/training/pair_model/tuning.py swaps in a tuned one)
        self.floor = floor  # replaced with it
        self.max_error = max_error  # delta: the error rate's bound the evidence must keep
        self.store = store
        self.local = local  # this gateway's indexes: each entry's bar is read there on lookups
        self.learned: Learned | None = None

    @property
    def point(self) -> OperatingPoint | None:
        """The operating point serving now: the trained one as the evidence moved it."""
        return self.learned.point if self.learned is not None else self.trained

    async def relearn(self) -> Learned | None:
        """Read the evidence and move the thresholds (every sweep; any gateway reads the same list)."""
        if self.trained is None or self.store is None:
            return None
        observations = await self.store.observations()
        self.learned = learn(observations, self.trained, self.max_error, self.floor)
        return self.learned

    async def observe(self, observation: Observation) -> None:
        """Keep one piece of evidence; a wrong answer raises its entry's bar above its cosine."""
        try:
            await self.store.add_observation(observation)
            if not observation.agreed:
                bar = await self.store.raise_bar(observation.entry, round(observation.cosine + BAR_MARGIN, 6))
                if bar is not None:
                    self.local.set_bar(observation.entry, bar)
        except (RedisError, OSError) as exc:
            log.warning("event=cache_evidence_not_recorded error=%r", exc)
