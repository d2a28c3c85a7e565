"""The answer cache on real Redis, the real embedding model and real FAISS (no worker needed); its
hit rule and evaluation without them are tests/test_cache_rules.py."""
from __future__ import annotations

import asyncio
import copy
import logging

import pytest

from cache.answer_cache import AnswerCache
from cache.index import Item
from cache.query import make_query
from cache.vetoes import conflicts
from ops.core import redis_keys
from ops.core.messages import ChatMessage, GenerateParams
from ops.core.settings import Settings
from tests.services import free_port, wait_until_async


@pytest.fixture
def settings(redis_server):
    redis_server.client.flushdb()
    return Settings(redis_url=redis_server.url, cache_sweep_interval_s=0.2)


def ask(renderer, question: str, system: str | None = None, model: str = "smollm2-135m-instruct", **params):
    messages = ([ChatMessage(role="system", content=system)] if system else []) + [ChatMessage(role="user", content=question)]
    # Greedy and 128 tokens unless a test says otherwise (the protocol fills these for live requests).
    params = {"max_tokens": 128, "temperature": 0.0, "top_p": 1.0, "top_k": 0, "repetition_penalty": 1.0, **params}
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
        reworded = await cache.lookup(ask(renderer, "Tell me how to improve my English speaking."))
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
    ("How do I convert Celsius to Fahrenheit?", "How do I convert Fahrenheit to Celsius?", "order"),
    ("Cheap flights from Paris to London", "Cheap flights from London to Paris", "order"),
    ("How do I turn on dark mode on my iPhone?", "How do I turn off dark mode on my iPhone?", "opposites"),
    ("Is coffee good for you?", "Is coffee bad for you?", "opposites"),
]


@pytest.mark.parametrize("stored_q, asked_q, guard", GUARD_CASES)
def test_questions_that_embed_close_but_differ_do_not_hit(settings, embedder, renderer, stored_q, asked_q, guard):
    async def main():
        cache = AnswerCache(settings, embedder)
        await stored(cache, ask(renderer, stored_q))
        query = ask(renderer, asked_q)
        vector = embedder.embed_one(asked_q)
        return await cache.lookup(query), cache.candidates(cache.local.indexes.get(query.namespace), asked_q, vector)

    lookup, candidates = run(main())
    assert lookup.hit is None
    # The guard matters: the stored question is a near neighbour, vetoed by the named guard.
    assert candidates and candidates[0].cosine > 0.7
    assert guard in conflicts(asked_q, stored_q) and guard in candidates[0].vetoes


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


def test_ttl_expiry_removes_the_entry_from_redis_and_every_index(redis_server, embedder, renderer):
    redis_server.client.flushdb()
    settings = Settings(redis_url=redis_server.url, cache_ttl_s=1, cache_sweep_interval_s=0.2)

    async def main():
        a, b = AnswerCache(settings, embedder), AnswerCache(settings, embedder)
        await b.rebuild()
        follower = asyncio.create_task(b.follow(block_ms=100))
        entry_id = await stored(a, ask(renderer, "How do volcanoes form?"))
        await wait_until_async(lambda: b.size() == 1, 10, what="the second cache to follow the insert")
        in_b_before = b.size()
        await wait_until_async(a.store.expired, 10, what="the entry's TTL to run out")
        await a.sweep()
        await wait_until_async(lambda: b.size() == 0, 10, what="the second cache to follow the expiry")
        b.follower.stop()  # not a cancel: see cache/log_follower.py, stop
        await asyncio.wait_for(follower, 10)
        return entry_id, in_b_before, a.size(), b.size(), (await a.lookup(ask(renderer, "How do volcanoes form?"))).hit

    entry_id, in_b_before, a_after, b_after, hit = run(main())
    assert in_b_before == 1 and a_after == 0 and b_after == 0 and hit is None
    assert not redis_server.client.exists(redis_keys.cache_entry(entry_id))
    assert redis_server.client.zcard(redis_keys.CACHE_LRU) == 0
    # Nothing of the entry is left to grow: its namespace set and its namespace record are gone.
    assert list(redis_server.client.scan_iter(match=redis_keys.CACHE_NAMESPACE_PATTERN)) == []
    assert redis_server.client.hlen(redis_keys.CACHE_ENTRY_NAMESPACE) == 0


def test_expired_entries_leave_no_empty_index_behind(settings, embedder, renderer):
    """Every conversation makes a namespace: an index whose last entry went must go too."""
    async def main():
        cache = AnswerCache(settings, embedder)
        ids = [await stored(cache, ask(renderer, f"Question number {n} about volcanoes?", system=f"turn {n}"))
               for n in range(3)]
        namespaces = len(cache.local.indexes)
        for entry_id in ids:
            await cache.forget(entry_id)
        return namespaces, len(cache.local.indexes), cache.local.namespace_of

    before, after, namespace_of = run(main())
    assert before == 3 and after == 0 and namespace_of == {}


def test_a_hit_on_an_expired_entry_does_not_recreate_it_without_a_ttl(settings, embedder, renderer, redis_server):
    async def main():
        cache = AnswerCache(settings, embedder)
        entry_id = await stored(cache, ask(renderer, "Why is the sea salty?"))
        redis_server.client.delete(redis_keys.cache_entry(entry_id))  # as when its TTL ran out
        await cache.store.record_hit(entry_id, "semantic")
        return entry_id

    entry_id = run(main())
    assert not redis_server.client.exists(redis_keys.cache_entry(entry_id))


def test_index_rebuilds_happen_off_the_event_loop_and_lookups_go_on(settings, embedder, renderer):
    """Switching to HNSW (or compacting) is built on a worker thread and swapped in."""
    settings = settings.model_copy(update={"cache_hnsw_from": 40})
    questions = [f"How many moons does planet number {n} have?" for n in range(41)]

    async def main():
        cache = AnswerCache(settings, embedder)
        vectors = embedder.embed(questions)
        query = ask(renderer, questions[0])
        index_kinds = []
        for q, v in zip(questions, vectors):
            cache.local.add(query.namespace, q, Item(v, q))
            index_kinds.append(cache.local.indexes[query.namespace].kind)
        # The 40th add made a rebuild due; it was handed to a thread, not done inside add().
        building = query.namespace in cache.local.rebuilding
        found_meanwhile = cache.candidates(cache.local.indexes[query.namespace], questions[5], vectors[5])
        await wait_until_async(lambda: not cache.local.rebuilding, 60, interval=0.01, what="the rebuild to be swapped in")
        index = cache.local.indexes[query.namespace]
        return index_kinds, building, found_meanwhile, index.kind, len(index), index.search(vectors[7], 1)

    kinds, building, found_meanwhile, kind, size, nearest = run(main())
    assert set(kinds) == {"flat"} and building
    assert found_meanwhile and found_meanwhile[0].entry_id == questions[5]
    assert kind == "hnsw" and size == 41 and nearest[0].entry_id == questions[7]


def test_looping_answers_serve_only_the_same_request_and_a_cut_one_may_serve_rewordings(settings, embedder,
                                                                                      renderer):
    from cache.insert_path import repetitive

    loop = "The answer is the answer is the answer is the answer is the answer is the answer is"
    assert repetitive(loop) and not repetitive("Paris is the capital of France, and it is on the Seine.")

    async def main():
        cache = AnswerCache(settings, embedder)
        out = {}
        for name, q, answer, finish in (("cut", "Describe the water cycle.", "Water evaporates and", "length"),
                                        ("loop", "Describe photosynthesis.", loop, "stop")):
            await cache.insert(ask(renderer, q), None, [answer], finish, 5, 20)
            out[name] = ((await cache.lookup(ask(renderer, q))).hit,
                         (await cache.lookup(ask(renderer, q.replace("Describe", "Explain")))).hit)
        return out, cache.size()

    out, indexed = run(main())
    for exact, _ in out.values():
        assert exact is not None and exact.layer == "exact"
    assert out["loop"][1] is None
    # The cut answer (max_tokens is in its namespace) is in the semantic index; the loop is not.
    assert indexed == 1


def test_a_sampled_answer_that_loops_is_never_served_again(settings, embedder, renderer):
    # A sampled question's answers make a pool that later asks are served from: an unlucky draw that
    # looped ("L'Étoile, la femme femme, la femme femme, ...") never joins it, nor starts it.
    loop = "la femme femme, la femme femme, la femme femme, la femme femme, la femme femme, la femme femme,"

    async def main():
        cache = AnswerCache(settings, embedder)
        question = ask(renderer, "What is the capital of France?", temperature=0.7)
        assert question.sampled
        first = await cache.insert(question, None, [loop], "length", 10, 64)
        after_loop = await cache.lookup(question)
        good = await cache.insert(question, None, ["The capital of France is Paris."], "stop", 10, 8)
        filling = await cache.lookup(question)  # a short pool: a miss the model's answer fills
        joined = await cache.insert(question, filling, [loop], "length", 10, 64)
        entry = await cache.store.get_exact(question.exact_key)
        return first, after_loop, good, filling, joined, entry

    first, after_loop, good, filling, joined, entry = run(main())
    assert first is None and after_loop.hit is None and after_loop.pool is None
    assert good is not None and filling.pool == good
    assert joined is None and entry.pool == 1


def test_without_the_pair_model_the_semantic_layer_stays_off_not_loose(settings, embedder, renderer, caplog):
    settings = settings.model_copy(update={"cache_pair_model": "/nonexistent/pair_model.safetensors"})

    async def main():
        cache = AnswerCache(settings, embedder)
        await stored(cache, ask(renderer, "How far away is the Moon?"), "About 384,400 km.")
        return (cache.semantic_mode, (await cache.lookup(ask(renderer, "How far away is the Moon?"))).hit,
                (await cache.lookup(ask(renderer, "how far away is the moon"))).hit)

    with caplog.at_level(logging.ERROR, logger="brigade.cache"):
        mode, exact, reworded = run(main())
    assert mode == "off" and exact is not None and exact.layer == "exact" and reworded is None
    assert any("pair_model_unavailable" in r.getMessage() for r in caplog.records)


def test_a_failing_pair_model_gives_a_miss_never_an_unverified_hit(settings, embedder, renderer, caplog):
    async def main():
        cache = AnswerCache(settings, embedder)
        await stored(cache, ask(renderer, "How far away is the Moon?"), "About 384,400 km.")
        healthy = (await cache.lookup(ask(renderer, "how far away is the moon"))).hit

        def broken(question, candidates):
            raise RuntimeError("pair model broke")

        cache.pair_model = copy.copy(cache.pair_model)  # the loaded model is shared by the process
        cache.pair_model.score = broken
        return healthy, (await cache.lookup(ask(renderer, "How far away is the Moon"))).hit

    with caplog.at_level(logging.ERROR, logger="brigade.cache"):
        healthy, broken = run(main())
    assert healthy is not None and healthy.layer == "semantic" and broken is None
    assert any("pair_model_failed" in r.getMessage() for r in caplog.records)


def indexed(cache: AnswerCache, entry_id: str) -> bool:
    return any(entry_id in index for index in cache.local.indexes.values())


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
        assert (await a.lookup(ask(renderer, questions[0]))).hit  # the oldest is now the most recently used
        # The hit is recorded off the lookup's path: wait until the LRU order shows it.
        await wait_until_async(lambda: redis_server.client.zrange(redis_keys.CACHE_LRU, -1, -1) == [ids[0]], 10,
                               what="the hit to make the oldest entry the most recently used")
        ids.append(await stored(a, ask(renderer, questions[3])))
        await wait_until_async(lambda: not indexed(b, ids[1]) and indexed(b, ids[3]), 10,
                               what="the second cache to follow the insert and the eviction")
        b.follower.stop()  # not a cancel: see cache/log_follower.py, stop
        await asyncio.wait_for(follower, 10)
        return ids, a, b

    ids, a, b = run(main())
    evicted = ids[1]  # "Why do cats purr?" was used least recently
    assert not redis_server.client.exists(redis_keys.cache_entry(evicted))
    assert redis_server.client.zcard(redis_keys.CACHE_LRU) == 3
    for cache in (a, b):
        assert all(evicted not in index for index in cache.local.indexes.values())
        assert cache.size() == 3


def test_second_gateway_sees_inserts_and_deletions(settings, embedder, renderer):
    async def main():
        a, b = AnswerCache(settings, embedder), AnswerCache(settings, embedder)
        await b.rebuild()
        follower = asyncio.create_task(b.follow(block_ms=100))
        entry_id = await stored(a, ask(renderer, "How far away is the Moon?"), "About 384,400 km.")
        await wait_until_async(lambda: b.size() == 1, 10, what="the second cache to follow the insert")
        seen = b.size()
        reworded = (await b.lookup(ask(renderer, "how far away is the moon"))).hit
        await a.store.delete(entry_id)
        await wait_until_async(lambda: b.size() == 0, 10, what="the second cache to follow the deletion")
        b.follower.stop()  # not a cancel: see cache/log_follower.py, stop
        await asyncio.wait_for(follower, 10)
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
        redis_server.client.hset(redis_keys.cache_entry(entry_id), "chunks", "{not json")
        return await cache.lookup(ask(renderer, "What is the boiling point of water?"))

    with caplog.at_level(logging.WARNING, logger="brigade.cache"):
        lookup = run(main())
    assert lookup.hit is None
    assert any("cache_lookup_failed" in r.getMessage() for r in caplog.records)


def test_redis_down_degrades_to_a_miss_with_a_warning(embedder, renderer, caplog):
    settings = Settings(redis_url=f"redis://127.0.0.1:{free_port()}/0")

    async def main():
        cache = AnswerCache(settings, embedder)
        # A miss, not a wait: the client's retries give up on a refused connection (a deadline
        # far above them fails a lookup that hangs on a dead Redis instead of degrading).
        lookup = await asyncio.wait_for(cache.lookup(ask(renderer, "Anyone there?")), 60)
        stored_id = await asyncio.wait_for(cache.insert(ask(renderer, "Anyone there?"), None, ["x"], "stop", 1, 1), 60)
        return lookup, stored_id

    with caplog.at_level(logging.WARNING, logger="brigade.cache"):
        lookup, stored_id = run(main())
    assert lookup.hit is None and stored_id is None
    assert any("cache_lookup_failed" in r.getMessage() for r in caplog.records)


