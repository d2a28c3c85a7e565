# Over 400 lines: the key store, the limiter and the CLI on one real Redis, with the same key's life traced across them.
"""API keys and their per-key limits on a real redis-server: the store, the limiter, the CLI (what
needs no Redis: tests/test_api_keys_offline.py)."""
from __future__ import annotations

import asyncio
import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from gateway.admission.api_keys import AuthError, KeyStore, UnknownKey
from gateway.admission.limits import CONCURRENT, RATE_LIMITED, REQUESTS, TOKENS, KeyLimiter
from ops.commands.keys import run
from ops.core import redis_keys
from ops.core.redis_clients import async_client
from ops.core.settings import Settings
from tests.keys_cli import parse  # the CLI's subprocesses import it from here too

ROOT = Path(__file__).resolve().parent.parent
T = 1_800_000_000.0  # a fixed "now": the limiter's clock is an argument, so no test sleeps


@pytest.fixture
def url(redis_server) -> str:
    redis_server.client.flushdb()
    return redis_server.url


def with_redis(url: str, body):
    """Run `body(client)` on a fresh client, as the gateway builds it (ops.core.redis_clients)."""
    async def main():
        client = async_client(url)
        try:
            return await body(client)
        finally:
            await client.aclose()

    return asyncio.run(main())


def unauthorized(store: KeyStore, presented) -> AuthError:
    async def attempt():
        with pytest.raises(AuthError) as caught:
            await store.authenticate(presented)
        return caught.value

    return attempt()


# ---- the key store ------------------------------------------------------------------------------


def test_created_key_authenticates_as_its_record(url):
    async def body(r):
        store = KeyStore(r)
        plain, created = await store.create("team-a", rpm=10, tpm=1000, max_concurrent=2)
        found = await store.authenticate(plain)
        assert found == created
        assert (found.name, found.rpm, found.tpm, found.max_concurrent, found.revoked) == ("team-a", 10, 1000, 2, False)
        assert plain.startswith(f"brg_{found.id}_")

    with_redis(url, body)


def test_wrong_secret_unknown_id_malformed_and_missing_keys_are_unauthorized(url):
    async def body(r):
        store = KeyStore(r)
        plain, key = await store.create("team-a")
        secret = plain.split("_", 2)[2]
        other_id = "0" * 8 if key.id != "0" * 8 else "f" * 8
        wrong_secret = plain[:-1] + ("A" if plain[-1] != "A" else "B")
        cases = {
            "wrong secret": wrong_secret,
            "unknown id": f"brg_{other_id}_{secret}",
            "malformed": "sk-not-a-brigade-key",
            "truncated": plain[:-1],
            "with a bearer prefix": f"Bearer {plain}",
            "missing": None,
            "empty": "",
        }
        for case, presented in cases.items():
            error = await unauthorized(store, presented)
            assert error.code == "unauthorized", case
            assert "Authorization: Bearer KEY" in error.message, case
            assert "brigade keys create --name NAME" in error.message, case
        assert (await store.authenticate(plain)).id == key.id  # the real key still works

    with_redis(url, body)


def test_unknown_id_and_wrong_secret_are_told_apart_by_nothing(url):
    async def body(r):
        store = KeyStore(r)
        plain, key = await store.create("team-a")
        secret = plain.split("_", 2)[2]
        other_id = "0" * 8 if key.id != "0" * 8 else "f" * 8
        wrong = await unauthorized(store, plain[:-1] + ("A" if plain[-1] != "A" else "B"))
        unknown = await unauthorized(store, f"brg_{other_id}_{secret}")
        assert wrong.message == unknown.message

    with_redis(url, body)


def test_revoked_key_is_refused_on_the_next_request_and_keeps_its_record(url):
    async def body(r):
        store = KeyStore(r)
        plain, key = await store.create("leaver", rpm=5)
        await store.authenticate(plain)
        await store.record_usage(key.id, 7, 3, cache_hit=False)
        assert await store.revoke(key.id) is True
        error = await unauthorized(store, plain)
        assert error.code == "unauthorized" and "revoked" in error.message
        (listed,) = await store.list()
        assert listed.id == key.id and listed.revoked is True and listed.rpm == 5
        assert await store.usage(key.id) == {"requests": 1, "prompt_tokens": 7, "completion_tokens": 3, "cache_hits": 0}

    with_redis(url, body)


def test_revoke_accepts_the_whole_key_and_says_when_no_such_key_exists(url):
    async def body(r):
        store = KeyStore(r)
        plain, key = await store.create("team-a")
        other_id = "0" * 8 if key.id != "0" * 8 else "f" * 8
        assert await store.revoke(other_id) is False
        assert not await r.exists(redis_keys.api_key(other_id))  # no half record appears
        assert await store.revoke(plain) is True
        assert (await store.get(key.id)).revoked is True

    with_redis(url, body)


def test_redis_holds_the_digest_of_a_key_and_never_the_key(url, redis_server):
    async def body(r):
        store = KeyStore(r)
        plain, key = await store.create("team-a")
        await store.record_usage(key.id, 1, 1, cache_hit=False)
        return plain, key

    plain, key = with_redis(url, body)
    secret = plain.split("_", 2)[2]
    client = redis_server.client
    assert client.hget(redis_keys.api_key(key.id), "digest") == hashlib.sha256(plain.encode()).hexdigest()
    readers = {"hash": lambda k: [*client.hkeys(k), *client.hvals(k)], "set": client.smembers,
               "string": lambda k: [client.get(k)], "zset": lambda k: client.zrange(k, 0, -1)}
    stored = {name: readers[client.type(name)](name) for name in client.keys("*")}
    assert redis_keys.api_key(key.id) in stored and redis_keys.API_KEYS in stored
    for name, values in stored.items():
        assert not any(secret in value for value in values), name


def test_list_returns_every_key_with_its_limits(url):
    async def body(r):
        store = KeyStore(r)
        _, a = await store.create("a", rpm=1)
        _, b = await store.create("b", tpm=2)
        _, c = await store.create("c", max_concurrent=3)
        await store.revoke(b.id)
        listed = {k.id: k for k in await store.list()}
        assert set(listed) == {a.id, b.id, c.id}
        assert (listed[a.id].rpm, listed[b.id].tpm, listed[c.id].max_concurrent) == (1, 2, 3)
        assert [listed[i].revoked for i in (a.id, b.id, c.id)] == [False, True, False]
        assert await r.smembers(redis_keys.API_KEYS) == {a.id, b.id, c.id}

    with_redis(url, body)


def test_create_refuses_an_empty_name_and_negative_limits(url):
    async def body(r):
        store = KeyStore(r)
        for name, limits in [("  ", {}), ("x", {"rpm": -1}), ("x", {"tpm": -5}), ("x", {"max_concurrent": 1.5})]:
            with pytest.raises(ValueError):
                await store.create(name, **limits)
        assert await store.list() == []

    with_redis(url, body)


def test_record_usage_counts_requests_tokens_and_cache_hits(url):
    async def body(r):
        store = KeyStore(r)
        _, key = await store.create("team-a")
        _, other = await store.create("team-b")
        assert await store.usage(key.id) == {"requests": 0, "prompt_tokens": 0, "completion_tokens": 0, "cache_hits": 0}
        await store.record_usage(key.id, 12, 30, cache_hit=False)
        await store.record_usage(key.id, 8, 5, cache_hit=True)
        assert await store.usage(key.id) == {"requests": 2, "prompt_tokens": 20, "completion_tokens": 35,
                                             "cache_hits": 1}
        assert (await store.usage(other.id))["requests"] == 0
        with pytest.raises(UnknownKey):
            await store.usage("0" * 8 if key.id != "0" * 8 else "f" * 8)

    with_redis(url, body)


# ---- the limiter --------------------------------------------------------------------------------


async def new_key_with(r, **limits):
    _, key = await KeyStore(r).create("limited", **limits)
    return key


def test_burst_of_100_with_rpm_10_admits_exactly_10(url):
    async def body(r):
        key = await new_key_with(r, rpm=10)
        limiter = KeyLimiter(r)
        outcomes = await asyncio.gather(*(limiter.admit(key, f"req-{n}", now=T) for n in range(100)))
        refusals = [o for o in outcomes if o is not None]
        assert len(refusals) == 90
        for refusal in refusals:
            assert refusal.code == RATE_LIMITED and refusal.limit == REQUESTS
            assert 0 < refusal.retry_after_s <= 60
            assert "10 requests per minute" in refusal.message

    with_redis(url, body)


def test_rpm_retry_after_is_when_the_oldest_admission_leaves_the_window(url):
    async def body(r):
        key = await new_key_with(r, rpm=3)
        limiter = KeyLimiter(r)
        for n in range(3):
            assert await limiter.admit(key, f"a{n}", now=T + n) is None
        refusal = await limiter.admit(key, "b", now=T + 30)
        assert refusal.retry_after_s == pytest.approx(30)
        assert await limiter.admit(key, "c", now=T + 59.9) is not None
        assert await limiter.admit(key, "d", now=T + 60) is None  # a0 left the window
        assert (await limiter.admit(key, "e", now=T + 60.5)).retry_after_s == pytest.approx(0.5)

    with_redis(url, body)


def test_another_key_is_not_slowed_by_a_burst(url):
    async def body(r):
        busy = await new_key_with(r, rpm=10)
        quiet = await new_key_with(r, rpm=50)
        limiter = KeyLimiter(r)
        burst = [limiter.admit(busy, f"busy-{n}", now=T) for n in range(100)]
        others = [limiter.admit(quiet, f"quiet-{n}", now=T) for n in range(50)]
        outcomes = await asyncio.gather(*[c for pair in zip(burst, others) for c in pair], *burst[50:])
        quiet_outcomes = outcomes[1:100:2]
        assert len(quiet_outcomes) == 50 and all(o is None for o in quiet_outcomes)
        assert sum(o is None for o in outcomes) == 50 + 10

    with_redis(url, body)


def test_two_gateways_share_one_limit(url):
    async def body(r):
        key = await new_key_with(r, rpm=10)
        other = async_client(url)
        try:
            first, second = KeyLimiter(r), KeyLimiter(other)
            outcomes = await asyncio.gather(*(g.admit(key, f"{name}-{n}", now=T)
                                              for n in range(50) for name, g in (("g1", first), ("g2", second))))
        finally:
            await other.aclose()
        assert sum(o is None for o in outcomes) == 10

    with_redis(url, body)


def test_tpm_refuses_once_charged_tokens_reach_the_limit_and_admits_after_the_window(url):
    async def body(r):
        key = await new_key_with(r, tpm=100)
        limiter = KeyLimiter(r)
        assert await limiter.admit(key, "a", now=T) is None
        await limiter.charge_tokens(key.id, 60, now=T)
        assert await limiter.admit(key, "b", now=T + 1) is None  # 60 < 100
        await limiter.charge_tokens(key.id, 40, now=T + 2)
        refusal = await limiter.admit(key, "c", now=T + 3)
        assert refusal.code == RATE_LIMITED and refusal.limit == TOKENS
        assert "100 tokens per minute" in refusal.message
        # dropping the first charge (at T) brings the window under the limit
        assert refusal.retry_after_s == pytest.approx(57)
        assert await limiter.admit(key, "d", now=T + 59.5) is not None
        assert await limiter.admit(key, "e", now=T + 60) is None
        assert int(await r.get(redis_keys.key_tokens_total(key.id))) == 40
        assert await limiter.admit(key, "f", now=T + 62) is None
        assert not await r.exists(redis_keys.key_tokens(key.id), redis_keys.key_tokens_total(key.id))

    with_redis(url, body)


def test_an_answer_that_crosses_the_tpm_limit_blocks_until_enough_tokens_leave(url):
    async def body(r):
        key = await new_key_with(r, tpm=100)
        limiter = KeyLimiter(r)
        await limiter.charge_tokens(key.id, 30, now=T)
        await limiter.charge_tokens(key.id, 30, now=T + 10)
        await limiter.charge_tokens(key.id, 500, now=T + 20)
        refusal = await limiter.admit(key, "a", now=T + 21)
        assert refusal.retry_after_s == pytest.approx(59)  # only when the 500 leave at T + 80
        assert await limiter.admit(key, "b", now=T + 70) is not None
        assert await limiter.admit(key, "c", now=T + 80) is None

    with_redis(url, body)


def test_max_concurrent_refuses_the_next_request_until_one_is_released(url):
    async def body(r):
        key = await new_key_with(r, max_concurrent=2)
        limiter = KeyLimiter(r)
        assert await limiter.admit(key, "a", now=T) is None
        assert await limiter.admit(key, "b", now=T) is None
        refusal = await limiter.admit(key, "c", now=T)
        assert refusal.code == RATE_LIMITED and refusal.limit == CONCURRENT
        assert refusal.retry_after_s == 1.0 and "2 concurrent requests" in refusal.message
        assert await limiter.admit(key, "c", now=T + 1) is not None
        await limiter.release(key.id, "a")
        assert await limiter.admit(key, "c", now=T + 1) is None
        assert await limiter.admit(key, "d", now=T + 1) is not None

    with_redis(url, body)


def test_a_crashed_gateways_slot_is_freed_after_the_stale_age(url):
    async def body(r):
        key = await new_key_with(r, max_concurrent=1)
        limiter = KeyLimiter(r, stale_s=100)
        assert await limiter.admit(key, "never-released", now=T) is None
        assert await limiter.admit(key, "b", now=T + 99) is not None
        assert await limiter.admit(key, "b", now=T + 101) is None

    with_redis(url, body)


def test_a_refused_request_records_nothing(url):
    async def body(r):
        key = await new_key_with(r, rpm=3, max_concurrent=1)
        limiter = KeyLimiter(r)
        assert await limiter.admit(key, "a", now=T) is None
        for n in range(5):  # refused by concurrency: must not use up the rpm
            assert (await limiter.admit(key, f"refused-{n}", now=T)).limit == CONCURRENT
        assert await r.zrange(redis_keys.key_requests(key.id), 0, -1) == ["a"]
        assert await r.zrange(redis_keys.key_in_flight(key.id), 0, -1) == ["a"]
        await limiter.release(key.id, "a")
        assert await limiter.admit(key, "b", now=T + 1) is None
        await limiter.release(key.id, "b")
        assert await limiter.admit(key, "c", now=T + 2) is None
        await limiter.release(key.id, "c")
        refusal = await limiter.admit(key, "d", now=T + 3)  # refused by rpm: must not take a slot
        assert refusal.limit == REQUESTS
        assert await r.zcard(redis_keys.key_in_flight(key.id)) == 0

    with_redis(url, body)


def test_when_several_limits_refuse_the_one_with_the_longest_wait_is_named(url):
    async def body(r):
        key = await new_key_with(r, rpm=1, max_concurrent=1)
        limiter = KeyLimiter(r)
        assert await limiter.admit(key, "a", now=T) is None
        refusal = await limiter.admit(key, "b", now=T + 10)
        assert refusal.limit == REQUESTS and refusal.retry_after_s == pytest.approx(50)

    with_redis(url, body)


def test_every_limit_key_expires(url):
    async def body(r):
        key = await new_key_with(r, rpm=10, tpm=1000, max_concurrent=5)
        limiter = KeyLimiter(r, window_s=60, stale_s=600)
        assert await limiter.admit(key, "a") is None
        await limiter.charge_tokens(key.id, 50)
        for name, most in [(redis_keys.key_requests(key.id), 60_000), (redis_keys.key_tokens(key.id), 60_000),
                           (redis_keys.key_tokens_total(key.id), 60_000), (redis_keys.key_in_flight(key.id), 600_000)]:
            assert 0 < await r.pttl(name) <= most, name

    with_redis(url, body)


def test_an_unlimited_key_is_always_admitted_and_keeps_no_limit_state(url):
    async def body(r):
        key = await new_key_with(r)
        limiter = KeyLimiter(r)
        outcomes = await asyncio.gather(*(limiter.admit(key, f"req-{n}", now=T) for n in range(200)))
        assert all(o is None for o in outcomes)
        assert [k async for k in r.scan_iter(match=f"{redis_keys.PREFIX}:limit:*")] == []

    with_redis(url, body)


# ---- the CLI ------------------------------------------------------------------------------------


def authenticate(url: str, plain: str):
    return with_redis(url, lambda r: KeyStore(r).authenticate(plain))


def test_cli_create_prints_a_key_that_authenticates_and_revoke_makes_it_fail(url, capsys):
    # a real process, as an operator runs it: stdout is the key alone
    code = ("import sys; from ops.commands.keys import run; from ops.core.settings import Settings; "
            "from tests.test_api_keys import parse; "
            "sys.exit(run(parse('create', '--name', 'ci', '--rpm', '5', '--max-concurrent', '2'), Settings()))")
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60,
                          env={**os.environ, "BRIGADE_REDIS_URL": url})
    assert done.returncode == 0, done.stderr
    plain = done.stdout.strip()
    assert done.stdout == plain + "\n"
    assert "will not be shown again" in done.stderr and plain not in done.stderr
    key = authenticate(url, plain)
    assert (key.name, key.rpm, key.tpm, key.max_concurrent) == ("ci", 5, 0, 2)

    settings = Settings(redis_url=url)
    assert run(parse("list", "--json"), settings) == 0
    (listed,) = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert listed["id"] == key.id and listed["revoked"] is False

    assert run(parse("revoke", key.id), settings) == 0
    with pytest.raises(AuthError):
        authenticate(url, plain)
    capsys.readouterr()
    assert run(parse("list"), settings) == 0
    header, row = capsys.readouterr().out.splitlines()
    assert header.split()[:6] == ["ID", "NAME", "RPM", "TPM", "MAX_CONCURRENT", "REVOKED"]
    assert row.split()[:6] == [key.id, "ci", "5", "unlimited", "2", "yes"]


def test_cli_revoke_of_an_unknown_key_fails(url, capsys):
    assert run(parse("revoke", "0123abcd"), Settings(redis_url=url)) == 1
    assert "no API key 0123abcd" in capsys.readouterr().err
    assert run(parse("revoke", "not-an-id"), Settings(redis_url=url)) == 2


def test_cli_usage_shows_every_key_or_one(url, capsys):
    async def body(r):
        store = KeyStore(r)
        _, a = await store.create("a")
        _, b = await store.create("b")
        await store.record_usage(a.id, 10, 20, cache_hit=True)
        return a, b

    a, b = with_redis(url, body)
    settings = Settings(redis_url=url)
    assert run(parse("usage", "--json"), settings) == 0
    every = {d["id"]: d for d in map(json.loads, capsys.readouterr().out.splitlines())}
    assert every[a.id] == {"id": a.id, "name": "a", "revoked": False, "requests": 1, "prompt_tokens": 10,
                           "completion_tokens": 20, "cache_hits": 1}
    assert every[b.id]["requests"] == 0
    assert run(parse("usage", b.id, "--json"), settings) == 0
    assert [json.loads(line)["id"] for line in capsys.readouterr().out.splitlines()] == [b.id]
    assert run(parse("usage", "0123abcd" if a.id != "0123abcd" else "0123abce"), settings) == 1
