"""The answer cache on real Redis, the real embedding model and real FAISS (no worker needed)."""
from __future__ import annotations

import asyncio
import logging
import time

import pytest

from cache.answer_cache import AnswerCache
from cache.guards import conflicts
from cache.query import PromptRenderer, make_query
from ops import keys
from ops.messages import ChatMessage, GenerateParams
from ops.settings import Settings
from tests.services import free_port


@pytest.fixture(scope="module")
def embedder():
    from cache.embedder import Embedder

    return Embedder(threads=1)


@pytest.fixture(scope="module")
def renderer(model_dir):
    return PromptRenderer(model_dir)


@pytest.fixture
def settings(redis_server):
    redis_server.client.flushdb()
    return Settings(redis_url=redis_server.url, cache_sweep_interval_s=0.2)


def ask(renderer, question: str, system: str | None = None, model: str = "smollm2-135m-instruct", **params):
    messages = ([ChatMessage(role="system", content=system)] if system else []) + [ChatMessage(role="user", content=question)]
    return make_query(renderer, model, None, messages, GenerateParams(**params))


def run(coro):
    return asyncio.run(coro)


async def stored(cache: AnswerCache, query, answer: str = "stored answer") -> str:
    return await cache.insert(query, None, [answer[:6], answer[6:]], "stop", 10, 2)


def test_repeated_question_is_an_exact_hit(settings, embedder, renderer):
    async def main():
        cache = AnswerCache(settings, embedder)
        await stored(cache, ask(renderer, "What is the capital of France?"), "Paris is the capital.")
        return await cache.lookup(ask(renderer, "What is the capital of France?"))

    hit = run(main()).hit
    assert hit.layer == "exact" and hit.entry.answer == "Paris is the capital." and hit.similarity == 1.0


def test_reworded_question_is_a_semantic_hit_and_an_unrelated_one_misses(settings, embedder, renderer):
    async def main():
        cache = AnswerCache(settings, embedder)
        await stored(cache, ask(renderer, "How do I improve my English speaking?"), "Speak every day.")
        reworded = await cache.lookup(ask(renderer, "How can I improve my spoken English?"))
        unrelated = await cache.lookup(ask(renderer, "What is the best programming language for games?"))
        return reworded.hit, unrelated.hit

    reworded, unrelated = run(main())
    assert reworded is not None and reworded.layer == "semantic", "the rewording should hit"
    assert reworded.entry.answer == "Speak every day." and reworded.similarity > 0.85
    assert unrelated is None


GUARD_CASES = [
    ("How do I enable 2FA on my Google account?", "How do I disable 2FA on my Google account?", "opposites"),
    ("Is it safe to eat raw eggs?", "Is it not safe to eat raw eggs?", "negation"),
    ("What was the population of India in 1998?", "What was the population of India in 2008?", "numbers"),
    ("What are the best flights from London on Monday?", "What are the best flights from London on Friday?", "dates"),
    ("How do I install Python on Windows?", "How do I install Python on Ubuntu?", "entities"),
]


@pytest.mark.parametrize("stored_q, asked_q, guard", GUARD_CASES)
def test_questions_that_embed_close_but_differ_do_not_hit(settings, embedder, renderer, stored_q, asked_q, guard):
    async def main():
        cache = AnswerCache(settings, embedder)
        await stored(cache, ask(renderer, stored_q))
        query = ask(renderer, asked_q)
        vector = embedder.embed_one(asked_q)
        return await cache.lookup(query), cache.judge(query, vector)

    lookup, judgements = run(main())
    assert lookup.hit is None
    # The guard matters: the stored question is a near neighbour, vetoed by the named guard.
    assert judgements and judgements[0].neighbour.similarity > 0.7
    assert guard in conflicts(asked_q, stored_q) and not judgements[0].accepted


def test_namespaces_keep_system_prompt_model_and_temperature_apart(settings, embedder, renderer):
    q = "What is the capital of France?"

    async def main():
        cache = AnswerCache(settings, embedder)
        await stored(cache, ask(renderer, q))
        return [
            (await cache.lookup(ask(renderer, q, system="You are a pirate."))).hit,
            (await cache.lookup(ask(renderer, q, model="other-model"))).hit,
            (await cache.lookup(ask(renderer, q, temperature=0.7, seed=3))).hit,
            (await cache.lookup(ask(renderer, q, max_tokens=5))).hit,
            (await cache.lookup(ask(renderer, q))).hit,
        ]

    pirate, other_model, warmer, shorter, same = run(main())
    assert pirate is None and other_model is None and warmer is None and shorter is None
    assert same is not None and same.layer == "exact"


def test_only_deterministic_requests_are_stored_and_cache_off_skips(settings, embedder, renderer):
    async def main():
        cache = AnswerCache(settings, embedder)
        unseeded = await stored(cache, ask(renderer, "Tell me a joke.", temperature=0.9))
        seeded = await stored(cache, ask(renderer, "Tell me a joke.", temperature=0.9, seed=5))
        off = ask(renderer, "Tell me a joke.", temperature=0.9, seed=5)
        off = type(off)(**{**off.__dict__, "mode": "off"})
        return unseeded, seeded, (await cache.lookup(off)).hit

    unseeded, seeded, off_hit = run(main())
    assert unseeded is None and seeded is not None and off_hit is None


def test_ttl_expiry_removes_the_entry_from_redis_and_every_index(redis_server, embedder, renderer):
    redis_server.client.flushdb()
    settings = Settings(redis_url=redis_server.url, cache_ttl_s=1, cache_sweep_interval_s=0.2)

    async def main():
        a, b = AnswerCache(settings, embedder), AnswerCache(settings, embedder)
        await b.rebuild()
        follower = asyncio.create_task(b.follow(block_ms=100))
        entry_id = await stored(a, ask(renderer, "How do volcanoes form?"))
        await asyncio.sleep(0.5)
        in_b_before = b.size()
        await asyncio.sleep(1.0)
        await a.sweep()
        await asyncio.sleep(0.5)
        follower.cancel()
        return entry_id, in_b_before, a.size(), b.size(), (await a.lookup(ask(renderer, "How do volcanoes form?"))).hit

    entry_id, in_b_before, a_after, b_after, hit = run(main())
    assert in_b_before == 1 and a_after == 0 and b_after == 0 and hit is None
    assert not redis_server.client.exists(keys.cache_entry(entry_id))
    assert redis_server.client.zcard(keys.CACHE_LRU) == 0


def test_lru_eviction_removes_the_least_recently_used_entry_everywhere(redis_server, embedder, renderer):
    redis_server.client.flushdb()
    settings = Settings(redis_url=redis_server.url, cache_max_entries=3)
    questions = ["How do bees make honey?", "Why do cats purr?", "How are rainbows formed?", "What causes tides?"]

    async def main():
        a, b = AnswerCache(settings, embedder), AnswerCache(settings, embedder)
        await b.rebuild()
        follower = asyncio.create_task(b.follow(block_ms=100))
        ids = [await stored(a, ask(renderer, questions[0]))]
        for q in questions[1:3]:
            ids.append(await stored(a, ask(renderer, q)))
        await asyncio.sleep(0.01)
        assert (await a.lookup(ask(renderer, questions[0]))).hit  # the oldest is now the most recently used
        await asyncio.sleep(0.2)
        ids.append(await stored(a, ask(renderer, questions[3])))
        await asyncio.sleep(0.5)
        follower.cancel()
        return ids, a, b

    ids, a, b = run(main())
    evicted = ids[1]  # "Why do cats purr?" was used least recently
    assert not redis_server.client.exists(keys.cache_entry(evicted))
    assert redis_server.client.zcard(keys.CACHE_LRU) == 3
    for cache in (a, b):
        assert all(evicted not in index for index in cache.indexes.values())
        assert cache.size() == 3


def test_second_gateway_sees_inserts_and_deletions(settings, embedder, renderer):
    async def main():
        a, b = AnswerCache(settings, embedder), AnswerCache(settings, embedder)
        await b.rebuild()
        follower = asyncio.create_task(b.follow(block_ms=100))
        entry_id = await stored(a, ask(renderer, "How far away is the Moon?"), "About 384,400 km.")
        await asyncio.sleep(0.5)
        seen = b.size()
        reworded = (await b.lookup(ask(renderer, "What is the distance to the Moon?"))).hit
        await a.store.delete(entry_id)
        await asyncio.sleep(0.5)
        follower.cancel()
        return seen, reworded, b.size()

    seen, reworded, after = run(main())
    assert seen == 1 and reworded is not None and reworded.entry.answer == "About 384,400 km."
    assert after == 0


def test_index_rebuilt_at_start_holds_existing_entries(settings, embedder, renderer):
    async def main():
        a = AnswerCache(settings, embedder)
        await stored(a, ask(renderer, "Who wrote Hamlet?"))
        fresh = AnswerCache(settings, embedder)
        await fresh.rebuild()
        return fresh.size()

    assert run(main()) == 1


def test_corrupted_entry_degrades_to_a_miss_with_a_warning(settings, embedder, renderer, redis_server, caplog):
    async def main():
        cache = AnswerCache(settings, embedder)
        entry_id = await stored(cache, ask(renderer, "What is the boiling point of water?"))
        redis_server.client.hset(keys.cache_entry(entry_id), "chunks", "{not json")
        return await cache.lookup(ask(renderer, "What is the boiling point of water?"))

    with caplog.at_level(logging.WARNING, logger="brigade.cache"):
        lookup = run(main())
    assert lookup.hit is None
    assert any("cache_lookup_failed" in r.getMessage() for r in caplog.records)


def test_redis_down_degrades_to_a_miss_with_a_warning(embedder, renderer, caplog):
    settings = Settings(redis_url=f"redis://127.0.0.1:{free_port()}/0")

    async def main():
        cache = AnswerCache(settings, embedder)
        started = time.monotonic()
        lookup = await cache.lookup(ask(renderer, "Anyone there?"))
        stored_id = await cache.insert(ask(renderer, "Anyone there?"), None, ["x"], "stop", 1, 1)
        return lookup, stored_id, time.monotonic() - started

    with caplog.at_level(logging.WARNING, logger="brigade.cache"):
        lookup, stored_id, _ = run(main())
    assert lookup.hit is None and stored_id is None
    assert any("cache_lookup_failed" in r.getMessage() for r in caplog.records)


def test_eval_counts_a_hit_correct_only_when_a_duplicates_q2_returns_its_own_q1(settings, embedder, redis_server):
    from cache.evaluation import Outcome, evaluate, metrics
    from cache.pairs import Pair

    pairs = [
        Pair("How far away is the Moon?", "What is the distance to the Moon?", True),
        Pair("How do I enable 2FA on my Google account?", "How do I disable 2FA on my Google account?", False),
        Pair("How do I reset my password?", "What should I do to reset my password?", True),
        Pair("Who wrote Hamlet?", "What is the boiling point of water?", False),
    ]
    report = run(evaluate(AnswerCache(settings, embedder), pairs))
    d = report["default"]
    assert (d["n_pairs"], d["hits"], d["precision"], d["recall"], d["false_hit_rate"]) == (4, 2, 1.0, 1.0, 0.0)
    assert redis_server.client.zcard(keys.CACHE_LRU) == 0, "the throwaway namespace was not removed"

    # The counting itself: a duplicate served another entry is a false hit, like a non-duplicate's hit.
    outcomes = [Outcome(0.9, True, duplicate=True), Outcome(0.9, False, duplicate=True),
                Outcome(0.9, False, duplicate=False), Outcome(0.2, False, duplicate=True)]
    m = metrics(outcomes, [Pair("a", "b", o.duplicate) for o in outcomes], 0.5)
    assert (m["hits"], m["precision"], m["recall"], m["false_hit_rate"]) == (3, 0.3333, 0.3333, 0.5)
    assert (m["false_hits_on_duplicates"], m["false_hits_on_non_duplicates"]) == (1, 1)
