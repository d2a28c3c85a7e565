"""The answer cache as the gateway uses it: look up (exact, then semantic), store, stay in step.

Lookups never fail a request: any cache problem (Redis down, a corrupted entry) is logged and
counted as a miss. Each gateway keeps one FAISS index per namespace, rebuilt from Redis at start
and then following the shared add/delete log; any gateway may sweep expired entries.
"""
from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, replace

import numpy as np
from redis.exceptions import RedisError

from cache.embedder import Embedder
from cache.guards import conflicts
from cache.index import Neighbour, VectorIndex
from cache.query import CacheQuery
from cache.store import AlreadyStored, CorruptEntry, Entry, EntryStore, decode_vector, new_entry_id
from cache.verifier import WEIGHTS, Verifier
from ops import keys
from ops.redis_pool import shared_client
from ops.settings import Settings

log = logging.getLogger("brigade.cache")


@dataclass
class Hit:
    entry: Entry
    layer: str  # "exact" or "semantic"
    similarity: float  # cosine of the questions (1.0 for exact)
    score: float | None = None  # the verifier's probability (semantic hits)


@dataclass
class Lookup:
    hit: Hit | None
    vector: np.ndarray | None = None  # the question's embedding, reused when the answer is stored


@dataclass(frozen=True)
class Judgement:
    """Why a semantic candidate was or was not served (for eval and logs)."""

    neighbour: Neighbour
    vetoes: tuple[str, ...]
    score: float | None  # the verifier's probability, when the verifier is on
    accepted: bool = False

    @property
    def value(self) -> float:
        """What the threshold and the ambiguity rule compare: the verifier's score, else the cosine."""
        return self.score if self.score is not None else self.neighbour.similarity


class AnswerCache:
    def __init__(self, settings: Settings, embedder: Embedder | None = None, verifier: Verifier | None = None):
        self.settings = settings
        self.redis = shared_client(settings.cache_redis, socket_timeout=2, socket_connect_timeout=2,
                                   decode_responses=True)
        self.store = EntryStore(self.redis, settings.cache_ttl_s, settings.cache_max_entries, settings.cache_log_maxlen)
        self.embedder = embedder or Embedder(
            settings.embedding_model or None, threads=settings.embedding_threads, int8=settings.embedding_int8
        )
        if verifier is None and settings.cache_verifier == "on" and WEIGHTS.exists():
            verifier = Verifier.load()
        self.verifier = verifier
        self.indexes: dict[str, VectorIndex] = {}
        self._log_cursor = "0-0"
        self._pending: set[asyncio.Task] = set()  # bookkeeping writes kept off the hit path

    def _later(self, coro) -> None:
        task = asyncio.ensure_future(coro)
        self._pending.add(task)
        task.add_done_callback(self._pending.discard)

    @property
    def ambiguity(self) -> float:
        if self.settings.cache_ambiguity is not None:
            return self.settings.cache_ambiguity
        if self.verifier is not None:
            return self.verifier.default_ambiguity
        return self.settings.cache_cosine_ambiguity

    @property
    def threshold(self) -> float:
        if self.settings.cache_threshold is not None:
            return self.settings.cache_threshold
        if self.verifier is not None:
            return self.verifier.default_threshold
        return self.settings.cache_cosine_threshold

    # ---- lookup ----------------------------------------------------------------------------

    async def lookup(self, query: CacheQuery) -> Lookup:
        if query.mode == "off" or not query.storable:
            return Lookup(None)
        vector = None
        try:
            entry = await self.store.get_exact(query.exact_key)
            if entry is not None:
                self._later(self._record(entry.entry_id, "exact"))
                return Lookup(Hit(entry, "exact", 1.0))
            if query.mode == "exact" or not query.question:
                self._later(self._count("misses"))
                return Lookup(None)
            vector = await asyncio.to_thread(self.embedder.embed_one, query.question)
            hit = await self._semantic(query, vector)
            self._later(self._record(hit.entry.entry_id, "semantic") if hit else self._count("misses"))
            return Lookup(hit, vector)
        except (RedisError, OSError, CorruptEntry) as exc:
            log.warning("event=cache_lookup_failed error=%r", exc)
            return Lookup(None, vector)

    def judge(self, query: CacheQuery, vector: np.ndarray) -> list[Judgement]:
        """Every candidate of the question's namespace, best first, with the guards' and verifier's say."""
        index = self.indexes.get(query.namespace)
        if index is None:
            return []
        threshold = query.threshold if query.threshold is not None else self.threshold
        neighbours = [n for n in index.search(vector, self.settings.cache_candidates)
                      if n.similarity >= self.settings.cache_min_similarity]
        if not neighbours:
            return []
        if self.verifier is not None:
            scores = [float(x) for x in self.verifier.score(
                np.repeat(vector[None], len(neighbours), 0), np.stack([n.vector for n in neighbours]),
                [query.question] * len(neighbours), [n.question for n in neighbours],
            )]
        else:
            scores = [None] * len(neighbours)
        rated = sorted((Judgement(n, tuple(conflicts(query.question, n.question)), sc) for n, sc in zip(neighbours, scores)),
                       key=lambda j: j.value, reverse=True)
        contenders = [j for j in rated if not j.vetoes]
        out = []
        for j in rated:
            # Ambiguous: another unvetoed question scores almost as well, so which answer applies is unclear.
            rival = next((r for r in contenders if r.neighbour.entry_id != j.neighbour.entry_id
                          and not _same_text(r.neighbour.question, j.neighbour.question)), None)
            accepted = not j.vetoes and j.value >= threshold and (rival is None or rival.value < self.ambiguity)
            out.append(replace(j, accepted=accepted))
        out.sort(key=lambda j: j.accepted, reverse=True)  # stable: best first within each group
        return out

    async def _semantic(self, query: CacheQuery, vector: np.ndarray) -> Hit | None:
        for judgement in self.judge(query, vector):
            if not judgement.accepted:
                break
            n = judgement.neighbour
            entry = await self.store.get(n.entry_id)
            if entry is None:  # expired in Redis before the sweep reached it
                self._forget(query.namespace, n.entry_id)
                continue
            return Hit(entry, "semantic", n.similarity, judgement.score)
        return None

    async def _record(self, entry_id: str, layer: str) -> None:
        try:
            await self.store.record_hit(entry_id, layer)
        except RedisError as exc:
            log.warning("event=cache_hit_record_failed error=%r", exc)

    async def _count(self, counter: str) -> None:
        try:
            await self.store.count(counter)
        except RedisError:
            pass

    # ---- store -------------------------------------------------------------------------------

    async def insert(self, query: CacheQuery, vector: np.ndarray | None, chunks: list[str], finish_reason: str,
                     prompt_tokens: int, completion_tokens: int) -> str | None:
        """Store a finished answer; returns the entry id (None when not stored)."""
        if query.mode == "off" or not query.storable:
            return None
        try:
            if vector is None and query.question:
                vector = await asyncio.to_thread(self.embedder.embed_one, query.question)
            entry = Entry(new_entry_id(), query.question, chunks, finish_reason, prompt_tokens, completion_tokens,
                          query.namespace, query.exact_key, vector)
            evicted = await self.store.insert(entry)
        except AlreadyStored:
            return None
        except (RedisError, OSError) as exc:
            log.warning("event=cache_insert_failed error=%r", exc)
            return None
        if vector is not None and query.question:
            self._index(query.namespace).add(entry.entry_id, vector, query.question)
        for entry_id in evicted:
            self._forget_everywhere(entry_id)
        return entry.entry_id

    def _index(self, namespace: str) -> VectorIndex:
        index = self.indexes.get(namespace)
        if index is None:
            index = self.indexes[namespace] = VectorIndex(self.embedder.dim, hnsw_from=self.settings.cache_hnsw_from)
        return index

    def _forget(self, namespace: str, entry_id: str) -> None:
        index = self.indexes.get(namespace)
        if index is not None:
            index.remove(entry_id)

    def _forget_everywhere(self, entry_id: str) -> None:
        for index in self.indexes.values():
            index.remove(entry_id)

    # ---- staying in step with the other gateways ---------------------------------------------------

    async def rebuild(self) -> int:
        """Load every entry from Redis into fresh indexes; remember where the log stood."""
        last = await self.redis.xrevrange(keys.CACHE_LOG, count=1)
        self._log_cursor = last[0][0] if last else "0-0"
        self.indexes = {}
        n = 0
        async for entry_id, namespace, question, vector in self.store.scan_entries():
            self._index(namespace).add(entry_id, vector, question)
            n += 1
        log.info("event=cache_index_rebuilt entries=%d namespaces=%d", n, len(self.indexes))
        return n

    async def follow(self, block_ms: int = 1000) -> None:
        """Apply the shared add/delete log to the local indexes, forever."""
        while True:
            try:
                replies = await self.redis.xread({keys.CACHE_LOG: self._log_cursor}, block=block_ms, count=1000)
                for _, events in replies or []:
                    for event_id, fields in events:
                        self._apply(fields)
                        self._log_cursor = event_id
                await self._check_not_trimmed()
            except (RedisError, OSError) as exc:
                log.warning("event=cache_follow_failed error=%r", exc)
                await asyncio.sleep(1.0)

    def _apply(self, event: dict) -> None:
        if event.get("op") == "add" and event.get("vector"):
            self._index(event["namespace"]).add(event["id"], decode_vector(event["vector"]), event.get("question", ""))
        elif event.get("op") == "del":
            if event.get("namespace"):
                self._forget(event["namespace"], event["id"])
            else:
                self._forget_everywhere(event["id"])

    async def _check_not_trimmed(self) -> None:
        # A gateway that fell further behind than the capped log reaches must start over.
        first = await self.redis.xrange(keys.CACHE_LOG, count=1)
        if first and self._log_cursor != "0-0" and _id_lt(self._log_cursor, first[0][0]):
            log.warning("event=cache_log_trimmed_past_cursor cursor=%s", self._log_cursor)
            await self.rebuild()

    async def sweep(self) -> int:
        """Delete expired entries (any gateway may; each id is deleted once)."""
        removed = 0
        for entry_id in await self.store.expired():
            if await self.store.delete(entry_id, "expirations"):
                removed += 1
            self._forget_everywhere(entry_id)
        return removed

    async def sweep_forever(self) -> None:
        while True:
            await asyncio.sleep(self.settings.cache_sweep_interval_s)
            try:
                await self.sweep()
            except (RedisError, OSError) as exc:
                log.warning("event=cache_sweep_failed error=%r", exc)

    async def start(self) -> list[asyncio.Task]:
        """Rebuild, then follow the log and sweep in the background (the gateway calls this)."""
        try:
            await self.rebuild()
        except (RedisError, OSError) as exc:
            log.warning("event=cache_rebuild_failed error=%r", exc)
        return [asyncio.create_task(self.follow()), asyncio.create_task(self.sweep_forever())]

    def size(self) -> int:
        return sum(len(i) for i in self.indexes.values())


def _same_text(a: str, b: str) -> bool:
    return " ".join(a.lower().split()) == " ".join(b.lower().split())


def _id_lt(a: str, b: str) -> bool:
    ta, sa = (int(x) for x in a.split("-"))
    tb, sb = (int(x) for x in b.split("-"))
    return (ta, sa) < (tb, sb)
