"""The model's answer after a miss: stored, added to a sampled question's pool, or learned from.

What `lookup` said decides (cache/lookup_path.py): a short pool gets the answer as one more
sample; a near miss has its stored answer compared with the model's, evidence for the thresholds
(cache/thresholds.py), and the new entry becomes an alias of it when the two are the same text.
Every finished answer is kept for the exact layer; only answers fit to serve to a rewording get a
vector (`reusable_for_rewordings`). Like lookups, storing never fails a request: a cache problem
is logged and the answer is not stored.
"""
from __future__ import annotations

import asyncio
import logging

from redis.exceptions import RedisError

from cache.embedder import Embedder
from cache.evidence import judge, observed, same_text
from cache.hit_rule import Candidate
from cache.index import Item
from cache.local_indexes import LocalIndexes
from cache.lookup_path import Lookup
from cache.query import CacheQuery
from cache.store import AlreadyStored, CorruptEntry, Entry, EntryStore, Sample, answer_digest, new_entry_id
from cache.thresholds import Thresholds

log = logging.getLogger("brigade.cache")


class InsertPath:
    def __init__(self, store: EntryStore | None, embedder: Embedder, local: LocalIndexes, thresholds: Thresholds, *,
                 samples: int, answer_agreement: float, judge_margin: float):
        self.store = store
        self.embedder = embedder
        self.local = local
        self.thresholds = thresholds  # where a near miss's evidence goes
        self.samples = samples  # a sampled question's pool is full at this many answers
        self.answer_agreement = answer_agreement  # the answers' cosine from which two answers agree
        self.judge_margin = judge_margin  # the evidence's judge (cache/evidence.judge)

    async def insert(self, query: CacheQuery, lookup: Lookup | None, chunks: list[str], finish_reason: str,
                     prompt_tokens: int, completion_tokens: int) -> str | None:
        """Store a finished answer (the model's, after `lookup` missed); returns the entry id it went
        to (None when not stored). A short pool gets it as one more sample; a near miss learns from it."""
        if query.mode == "off":
            return None
        lookup = lookup or Lookup(None)
        answer = "".join(chunks)
        if query.sampled and repetitive(answer):
            # A sampled loop is one unlucky draw: kept, it would be what every later ask is served
            # (a sampled question's first answer makes its pool, and a pool serves its samples).
            return None
        try:
            if lookup.pool is not None:
                sample = Sample(chunks, finish_reason, completion_tokens)
                await self.store.add_sample(lookup.pool, sample, exact_key=query.exact_key)
                return lookup.pool
            alias_of = await self._learn_from_near_miss(lookup.near, query.question, answer, query.sampled)
        except (RedisError, OSError, CorruptEntry) as exc:
            log.warning("event=cache_insert_failed error=%r", exc)
            return None
        # The same request gets the same answer, so the exact layer keeps any finished one; only
        # answers fit to serve to a rewording get a vector (the semantic layer): not a loop, and
        # (through the namespace) only for the same max_tokens.
        vector = lookup.vector
        if not reusable_for_rewordings(answer, finish_reason):
            vector = None
        elif vector is None and query.question:
            vector = await asyncio.to_thread(self.embedder.embed_one, query.question)
        try:
            entry = Entry(new_entry_id(), query.question, chunks, finish_reason, prompt_tokens, completion_tokens,
                          query.namespace, query.exact_key, vector, sampled=query.sampled,
                          answer_digest=answer_digest(answer), alias_of=alias_of or "")
            evicted = await self.store.insert(entry)
        except AlreadyStored:
            if query.sampled:  # another gateway stored this question first: the answer joins its pool
                return await self._join_pool(query, chunks, finish_reason, completion_tokens)
            return None
        except (RedisError, OSError) as exc:
            log.warning("event=cache_insert_failed error=%r", exc)
            return None
        if vector is not None and query.question:
            self.local.add(query.namespace, entry.entry_id, Item(vector, query.question, entry.answer_digest))
        for entry_id in evicted:
            self.local.forget(entry_id)
        return entry.entry_id

    async def _join_pool(self, query: CacheQuery, chunks: list[str], finish_reason: str,
                         completion_tokens: int) -> str | None:
        try:
            entry = await self.store.get_exact(query.exact_key)
            if entry is None or not entry.sampled or entry.pool >= self.samples:
                return None
            await self.store.add_sample(entry.entry_id, Sample(chunks, finish_reason, completion_tokens))
            return entry.entry_id
        except (RedisError, OSError, CorruptEntry) as exc:
            log.warning("event=cache_insert_failed error=%r", exc)
            return None

    async def _learn_from_near_miss(self, near: Candidate | None, asked: str, answer: str,
                                    sampled: bool) -> str | None:
        """Judge the near miss's stored answer against the asked question (evidence for the
        thresholds), and note whether the model's own answer agreed with it. The same text word
        for word (a greedy answer) makes the new entry an alias of the old: both hold one answer,
        so neither is the other's rival. Returns the id to alias."""
        if near is None:
            return None
        stored = await self.store.get_served(near.entry_id)
        if stored is None:
            return None
        verdict = await asyncio.to_thread(judge, asked, stored.question, stored.answer, answer, self.embedder,
                                          self.judge_margin, self.answer_agreement)
        await self.thresholds.observe(observed("near_miss", entry=near.entry_id, cosine=near.cosine, score=near.score,
                                               agreed=verdict.fits, same_as_model=verdict.same_as_model))
        return near.entry_id if not sampled and same_text(stored.answer, answer) else None


def reusable_for_rewordings(answer: str, finish_reason: str) -> bool:
    """Answers that finished (on their own, or cut by `max_tokens`) and do not loop. A reply cut
    off and repeating one phrase was once served to three rewordings: a loop is what is kept out
    (the exact layer still keeps it). A cut answer that does not loop is what the same request
    would get again, and it is served only to rewordings asked with the same `max_tokens`, since
    `max_tokens` is part of the namespace (cache/query.py). With `max_tokens` 48, most answers
    end by length: only `stop` answers got a vector before, and most rewordings missed."""
    if finish_reason not in ("stop", "length") or not answer.strip():
        return False
    return not repetitive(answer)


def repetitive(text: str, n: int = 4, share: float = 0.25) -> bool:
    """More than `share` of the answer's runs of `n` words are repeats: a model stuck in a loop."""
    words = text.lower().split()
    grams = [tuple(words[i:i + n]) for i in range(len(words) - n + 1)]
    return len(grams) >= 2 * n and (len(grams) - len(set(grams))) / len(grams) > share
