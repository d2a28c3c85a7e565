"""The answer cache's parts alone, on real Redis, without the embedding model or the pair model:
the shared-log follower (cache/log_follower.py), the thresholds that learn from evidence
(cache/thresholds.py) and the sweeper (cache/sweeper.py). Entries carry small random vectors;
what the parts do with real questions is tests/test_cache.py and tests/test_cache_learning.py."""
from __future__ import annotations

import asyncio

import numpy as np
import pytest

from cache.evidence import observed
from cache.hit_rule import OperatingPoint
from cache.index import Item
from cache.local_indexes import LocalIndexes
from cache.log_follower import SharedLogFollower
from cache.store import Entry, EntryStore, new_entry_id
from cache.sweeper import Sweeper
from cache.thresholds import Thresholds
from ops.core import redis_keys
from ops.core.redis_clients import async_client
from ops.core.settings import Settings
from tests.services import wait_until_async

DIM = 8
NAMESPACE = "ns-parts"


@pytest.fixture
def settings(redis_server):
    redis_server.client.flushdb()
    return Settings(redis_url=redis_server.url)


def vector(seed: int) -> np.ndarray:
    v = np.random.default_rng(seed).standard_normal(DIM).astype(np.float32)
    return v / np.linalg.norm(v)


def entry(question: str, seed: int) -> Entry:
    return Entry(new_entry_id(), question, ["an answer"], "stop", 3, 2, NAMESPACE, f"exact-{seed}", vector(seed),
                 answer_digest=f"answer-{seed}")


def indexes() -> LocalIndexes:
    return LocalIndexes(DIM, hnsw_from=10_000, in_background=asyncio.ensure_future)


def items(local: LocalIndexes) -> dict[str, Item]:
    return dict(local.indexes[NAMESPACE].live) if NAMESPACE in local.indexes else {}


def test_the_log_follower_rebuilds_then_applies_another_gateways_adds_bars_and_deletes_and_skips_a_bad_entry(
        settings, redis_server):
    async def main():
        store = EntryStore(async_client(settings.cache_redis), settings)  # another gateway's writes
        before = entry("Stored before this gateway started?", 1)
        await store.insert(before)
        local = indexes()
        follower = SharedLogFollower(async_client(settings.cache_redis), store, local)
        rebuilt = await follower.rebuild()
        at_start = set(items(local))
        following = asyncio.create_task(follower.follow(block_ms=100), name="cache-log-follower")
        # A log entry no gateway can apply (its bar is not a number) must not stop the follower.
        redis_server.client.xadd(redis_keys.CACHE_LOG, {"op": "bar", "id": before.entry_id, "bar": "high"})
        added, gone = entry("Added while following?", 2), entry("Added, then deleted?", 3)
        for e in (added, gone):
            await store.insert(e)
        await store.raise_bar(added.entry_id, 0.93)
        await store.delete(gone.entry_id)
        await wait_until_async(lambda: set(items(local)) == {before.entry_id, added.entry_id}
                               and items(local)[added.entry_id].bar == 0.93, 10,
                               what="the follower to apply the adds, the bar and the delete")
        follower.stop()
        await asyncio.wait_for(following, 10)  # its next read ends within block_ms
        last = redis_server.client.xrevrange(redis_keys.CACHE_LOG, count=1)[0][0]
        return rebuilt, at_start, items(local), follower.cursor, last, before, added

    rebuilt, at_start, followed, cursor, last, before, added = run(main())
    assert rebuilt == 1 and at_start == {before.entry_id}
    assert followed[added.entry_id].question == "Added while following?"
    assert followed[added.entry_id].answer == "answer-2"
    assert np.allclose(followed[added.entry_id].vector, vector(2))
    assert followed[before.entry_id].bar == 0.0 and cursor == last  # skipped, and followed past


def test_the_thresholds_serve_the_trained_point_until_evidence_moves_it_and_a_wrong_answer_raises_its_bar(
        settings, redis_server):
    trained = OperatingPoint(serve_cosine=0.9, band_cosine=0.8, agree=0.6, objection=0.0)

    async def main():
        store = EntryStore(async_client(settings.cache_redis), settings)
        local = indexes()
        thresholds = Thresholds(trained, max_error=0.2, store=store, local=local)
        served = entry("A stored question?", 4)
        await store.insert(served)
        local.add(NAMESPACE, served.entry_id, Item(served.vector, served.question, served.answer_digest))
        seen = [thresholds.point]
        # Twenty agreeing answers just above the band's floor: under delta = 20%, enough to serve there.
        for i in range(20):
            await thresholds.observe(observed("near_miss", entry=f"e{i}", cosine=0.85, score=None, agreed=True))
        seen.append(thresholds.point)  # observing alone does not move the point: relearning does
        learned = await thresholds.relearn()
        seen.append(thresholds.point)
        await thresholds.observe(observed("audit", entry=served.entry_id, cosine=0.87, score=0.7, agreed=False))
        return seen, learned, served, local

    (before, observed_only, after), learned, served, local = run(main())
    assert before == observed_only == trained
    assert learned.observations == 20 and learned.why["serve_cosine"] == "evidence_lower"
    assert after == learned.point and after.serve_cosine == 0.85 and after.band_cosine == 0.8
    # The wrong answer raised its entry's bar: in Redis, on the log for the other gateways, and here.
    assert float(redis_server.client.hget(redis_keys.cache_entry(served.entry_id), "bar")) == pytest.approx(0.88)
    assert redis_server.client.xrevrange(redis_keys.CACHE_LOG, count=1)[0][1] == {"op": "bar", "id": served.entry_id,
                                                                            "bar": "0.88"}
    assert items(local)[served.entry_id].bar == pytest.approx(0.88)
    assert redis_server.client.llen(redis_keys.CACHE_EVIDENCE) == 21


def test_thresholds_without_a_semantic_layer_learn_nothing(settings):
    async def main():
        thresholds = Thresholds(None, max_error=0.01, store=EntryStore(async_client(settings.cache_redis), settings),
                                local=indexes())
        return await thresholds.relearn(), thresholds.point

    assert run(main()) == (None, None)


def test_the_sweeper_deletes_an_expired_entry_once_drops_it_here_and_relearns_after_each_sweep(
        settings, redis_server):
    async def main():
        store = EntryStore(async_client(settings.cache_redis), settings)
        local = indexes()
        expired, fresh = entry("Expired?", 5), entry("Still fresh?", 6)
        for e in (expired, fresh):
            await store.insert(e)
            local.add(NAMESPACE, e.entry_id, Item(e.vector, e.question))
        redis_server.client.zadd(redis_keys.CACHE_EXPIRY, {expired.entry_id: 1.0})  # its time came long ago
        thresholds = Thresholds(OperatingPoint(), max_error=0.01, store=store, local=local)
        # Two gateways sweep at once: each id is deleted (and counted) once.
        other = Sweeper(store, indexes(), interval_s=0.05)
        sweeper = Sweeper(store, local, interval_s=0.05, after_each=thresholds.relearn)
        sweeping = [asyncio.create_task(s.run(), name="cache-sweeper") for s in (sweeper, other)]
        await wait_until_async(lambda: thresholds.learned is not None and expired.entry_id not in items(local), 10,
                               what="a sweep, then the thresholds relearned")
        for task in sweeping:
            task.cancel()
        return expired, fresh, local, await sweeper.sweep()

    expired, fresh, local, again = run(main())
    assert set(items(local)) == {fresh.entry_id} and again == 0
    assert not redis_server.client.exists(redis_keys.cache_entry(expired.entry_id))
    assert redis_server.client.zrange(redis_keys.CACHE_LRU, 0, -1) == [fresh.entry_id]
    assert redis_server.client.hget(redis_keys.CACHE_STATS, "expirations") == "1"


def run(coro):
    return asyncio.run(coro)
