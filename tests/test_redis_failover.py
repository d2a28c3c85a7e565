"""Redis fails over under load: a real primary, two replicas and three sentinels (ops/stack/redis_ha.py),
every Brigade process on the one redis+sentinel:// URL, and the primary SIGKILLed mid-stream.
Two real workers with the real default model, a reaper, a real gateway, real WebSocket clients
and a real API key (a batch job through a killed primary is tests/test_chaos.py's). Nothing is mocked. On the same real-model stack, last, a
worker SIGKILLed mid-stream: the real model's answers continue on the other worker word for word,
greedy ones and a seeded sampled one with n = 2 and logprobs, each choice token for token
(tests/test_failover.py proves the failover's mechanics, on the tiny model)."""
from __future__ import annotations

import asyncio
import json
import re
import statistics
import time

import httpx
import pytest
from websockets.asyncio.client import connect

from ops.core import redis_keys
from tests.clients import Answer, absorb
from tests.services import RedisHAServer, Stack, create_key, queued_params, wait_until, wait_until_async
from tests.streams import PROMPTS, assert_complete, busiest, claimed, uninterrupted
from tests.streams import stream_clients as streams

# Redis primaries killed and demoted under load, a worker killed: `make test-long`.
pytestmark = pytest.mark.long

HEARTBEAT_TTL_S = 3.0
MAX_TOKENS = 64


@pytest.fixture(scope="module")
def expected(invariant_engine) -> dict[str, str]:
    """What an uninterrupted run of the real model says to each prompt (the workers' deterministic mode)."""
    return uninterrupted(invariant_engine, MAX_TOKENS)


async def stream_clients(url: str, fault, **options):
    return await streams(url, fault, MAX_TOKENS, **options)


class HAStack(Stack):
    """The stack on a Redis HA set, keys required (the key in BRIGADE_API_KEY)."""


@pytest.fixture(scope="module")
def ha(model_dir, tmp_path_factory):
    redis_ha = RedisHAServer(tmp_path_factory.mktemp("redis-ha"))
    with HAStack(
        redis_ha, tmp_path_factory.mktemp("ha-logs"), own_redis=True,
        BRIGADE_CACHE_ENABLED="0", BRIGADE_TORCH_THREADS="1", BRIGADE_MAX_WAIT_MS="20",
        BRIGADE_HEARTBEAT_TTL_S=str(HEARTBEAT_TTL_S), BRIGADE_UNCLAIMED_AFTER_S="3", BRIGADE_AUTH="required",
        # Deterministic mode: a continued answer must equal the uninterrupted one token for token.
        BRIGADE_BATCH_INVARIANT="true",
    ) as s:
        s.start("reaper")
        s.start_worker("w1@ha")
        s.start_worker("w2@ha")
        s.start_gateway()
        s.wait_ready()
        # Made before any kill, for every test here (its clients send it):
        # no test depends on another having run first.
        s.env["BRIGADE_API_KEY"] = create_key(redis_ha.url, "before-the-kills")
        yield s


def test_a_claim_waits_for_a_replica_and_goes_on_without_one_after_its_bound(ha: HAStack, caplog):
    """With a Sentinel URL a claim is confirmed on a replica (WAIT) before its worker acts on it.
    With both replicas frozen it goes on after confirm_ms and says so in the log. Prints the
    cost per claim, side by side with and without the confirmation, on the same primary."""
    import os
    import signal

    from ops.core.messages import QueuedRequest
    from ops.core.settings import Settings
    from workers.claims import ClaimStore

    client = ha.redis.client
    confirmed = ClaimStore.from_settings(client, Settings(redis_url=ha.redis.url, confirm_ms=300))
    unconfirmed = ClaimStore.from_settings(client, Settings(redis_url=ha.redis.url, confirm_replicas=0))
    assert confirmed.settings.confirmations == 1

    def request(rid: str) -> str:
        client.set(redis_keys.request(rid), QueuedRequest(
            request_id=rid, client_id="c", reply_channel=redis_keys.reply_channel("g"), enqueued_at=time.time(),
            model="m", prompt="hi", params=queued_params(max_tokens=4)).model_dump_json(), ex=60)
        return rid

    # The stack's reaper would take these claims back (their owner never beats): give it a beat.
    client.set(redis_keys.worker("w#1"), "{}", ex=120)
    costs: dict[str, list[float]] = {"wait": [], "none": []}
    for i in range(40):
        for name, store in (("wait", confirmed), ("none", unconfirmed)):  # taking turns: the same load on both
            rid = request(f"cost-{name}-{i}")
            started = time.perf_counter()
            assert store.claim(rid, "w#1").outcome == "claimed"
            costs[name].append(time.perf_counter() - started)
    median = {k: statistics.median(v) * 1000 for k, v in costs.items()}
    print(f"\nclaim cost, median of 40: {median['wait']:.2f} ms with WAIT 1, {median['none']:.2f} ms without "
          f"(+{median['wait'] - median['none']:.2f} ms)")

    replicas = [ha.redis.procs[ha.redis.ha.node_name(p)] for p in ha.redis.ha.data_ports
                if p != ha.redis.ha.primary_port()]
    for proc in replicas:
        os.kill(proc.pid, signal.SIGSTOP)
    try:
        rid = request("frozen-replicas")
        with caplog.at_level("WARNING", logger="brigade.worker"):
            started = time.perf_counter()
            assert confirmed.claim(rid, "w#1").outcome == "claimed"
            waited = time.perf_counter() - started
    finally:
        for proc in replicas:
            os.kill(proc.pid, signal.SIGCONT)
    assert waited >= 0.3, waited  # it did wait for them, up to its bound
    assert any("event=claim_unconfirmed request_id=frozen-replicas replicas=0 wanted=1" in r.getMessage()
               for r in caplog.records), [r.getMessage() for r in caplog.records]
    assert client.hget(redis_keys.claim(rid), "owner") == "w#1"
    ha.redis.ha.wait_healthy(30)
    rids = [rid] + [f"cost-{name}-{i}" for i in range(40) for name in costs]  # leave the stack as it was
    client.delete(*[redis_keys.claim(r) for r in rids], *[redis_keys.request(r) for r in rids], redis_keys.worker("w#1"))
    client.hdel(redis_keys.CLAIMS, *rids)


def test_a_demoted_primary_answering_readonly_sends_every_part_to_the_new_one(ha: HAStack, expected):
    """A planned failover (SENTINEL FAILOVER) demotes the primary while it runs: clients still
    connected to it meet READONLY on their next write (celery #7946 shut workers down on it). Every
    stream completes as uninterrupted, and no part of Brigade exits."""
    ha.redis.ha.wait_healthy(60)
    before = ha.redis.ha.primary_port()
    demoted: dict = {}

    def fault(clients):
        sentinel = ha.redis.ha._sentinel(ha.redis.ha.sentinel_ports[0])
        assert sentinel.execute_command("SENTINEL", "FAILOVER", ha.redis.ha.master)
        demoted["port"] = before
        wait_until(lambda: ha.redis.ha.primary_port() not in (None, before), 30, what="a new primary")

    clients, _ = asyncio.run(stream_clients(ha.url, fault, headers={"Authorization": f"Bearer {ha.env['BRIGADE_API_KEY']}"}))
    assert_complete(clients, expected, ha)  # done, indexes whole, the uninterrupted text
    assert ha.redis.ha.primary_port() != before
    for proc in ha.started:
        assert proc.proc.poll() is None, f"{proc.log_path.name} exited ({proc.proc.returncode}):\n{proc.tail()}"
    # and the workers take new work from the new primary's queue, once the sentinels have turned
    # the demoted node into a replica. Until their next look at it (up to 10 s) it is a primary of
    # its own that keeps the writes of clients still connected to it, and drops them when turned:
    # Sentinel's failover reconfigures the replicas, not the old primary.
    ha.redis.ha.wait_healthy(60)
    fresh, _ = asyncio.run(stream_clients(ha.url, lambda clients: None, n=2,
                                          headers={"Authorization": f"Bearer {ha.env['BRIGADE_API_KEY']}"}))
    assert_complete(fresh, expected, ha)  # done, indexes whole, the uninterrupted text


def test_every_part_survives_one_more_failover_after_those(ha: HAStack, expected):
    """A failover switches kombu's connection to another address: after it, a worker must still run
    on Brigade's broker transport (workers/transport.py), or the next failover kills it (seen in the
    soak: kombu's own transport raised AttributeError restoring unacked messages, and both workers
    stopped). So: a SIGKILL of the primary, under 4 streams, after the planned failover above. And
    the API key made before both still authenticates against the new primary.

    A primary killed under streaming, SSE and batch load, nothing lost (each stream whole, no token
    twice, every batch line once and in order) is tests/test_chaos.py's, twice a run."""
    ha.redis.ha.wait_healthy(60)
    killed: dict = {}

    def fault(clients):
        killed["node"] = ha.redis.kill_primary()

    headers = {"Authorization": f"Bearer {ha.env['BRIGADE_API_KEY']}"}
    clients, _ = asyncio.run(stream_clients(ha.url, fault, n=4, headers=headers))
    assert_complete(clients, expected, ha)  # done, indexes whole, the uninterrupted text
    for proc in ha.started:
        assert proc.proc.poll() is None, f"{proc.log_path.name} exited ({proc.proc.returncode}):\n{proc.tail()}"
    for name, log in ((n, w.log_path.read_text()) for n, w in ha.workers.items()):
        assert "Unrecoverable error" not in log, f"{name}:\n{log[-3000:]}"
        assert "Connected to sentinel://" not in log, f"{name} fell back to kombu's own transport"
    assert ha.redis.ha.node_name(ha.redis.ha.primary_port()) != killed["node"]
    resp = httpx.post(ha.http + "/v1/completions", headers=headers, timeout=60,
                      json={"model": "smollm2-135m-instruct", "prompt": "Hello", "max_tokens": 2})
    assert resp.status_code == 200, resp.text
    assert httpx.post(ha.http + "/v1/completions", headers={"Authorization": "Bearer sk-wrong"}, timeout=60,
                      json={"prompt": "Hello", "max_tokens": 2}).status_code == 401
    ha.redis.restart(killed["node"])


def test_a_request_sent_as_a_failover_ends_is_answered_not_called_lost(ha: HAStack, expected):
    """Issue 38: 4 greedy streams, the primary SIGKILLed while they run (3 s after they started), and one new request
    ("Say hello.", greedy) sent the moment they are done: it was answered `unavailable` ("lost while
    Redis was unavailable") in 6 runs of 7. Its route was in the router while its put waited for the
    new primary, and the catch-up after the subscriber's reconnection, finding no record yet, ended
    it. Here the streams come through whole, and requests sent
    every 0.2 s from the kill until 3 s after the streams end (during the failover and right after
    it) are all answered. A gateway without keys, as in
    the report: with keys the request waits for its key before its route exists, which hides the
    race."""
    probes: dict[str, Answer] = {}

    async def round_(url: str) -> tuple[list, str]:
        loop = asyncio.get_running_loop()
        probing: dict = {"until": None}

        async def probe():
            async with connect(url) as ws:
                sent = []

                async def read():
                    while True:
                        absorb(probes, json.loads(await ws.recv()))

                reader = asyncio.create_task(read())
                while probing["until"] is None or time.monotonic() < probing["until"]:
                    # At most 32 unanswered at once (a connection may hold 64): a slow failover on a
                    # busy machine must not turn this into a test of that limit.
                    if sum(1 for p in sent if probes[p].end is None) < 32:
                        pid = f"p{len(probes)}"
                        probes[pid] = Answer(pid)
                        sent.append(pid)
                        await ws.send(json.dumps({"type": "generate", "id": pid, "max_tokens": 8, "temperature": 0,
                                                  "messages": [{"role": "user", "content": "Say hello."}]}))
                    await asyncio.sleep(0.2)
                await wait_until_async(lambda: all(probes[p].end for p in sent), 120, what="every request answered")
                reader.cancel()

        def kill(clients):  # once every stream has its first tokens; requests are sent from then on
            killed = ha.redis.kill_primary(), time.monotonic()
            probing["task"] = asyncio.run_coroutine_threadsafe(probe(), loop)
            return killed

        clients, (killed, killed_at) = await stream_clients(url, kill, n=4)
        streams_ended = time.monotonic()
        probing["until"] = streams_ended + 3
        await asyncio.wrap_future(probing["task"])
        assert killed_at < streams_ended, "the streams ended before the kill: this test shows nothing"
        return clients, killed

    # One failover: the module makes four more, and on a starved machine each more made the
    # sentinels flap (two replicas promoted in turn), which is another subject than this test's.
    with ha.another_gateway("open", BRIGADE_AUTH="off") as open_gateway:
        ha.redis.ha.wait_healthy(60)
        clients, killed = asyncio.run(round_(open_gateway.ws_url))
        assert_complete(clients, expected, ha)  # done, indexes whole, the uninterrupted text
        failed = {pid: a.end for pid, a in probes.items() if a.end["type"] != "done"}
        assert not failed, f"{len(failed)} of {len(probes)} requests failed: {failed}\n{open_gateway.tail(80)}"
        ha.redis.restart(killed)
    assert all(a.text.strip() for a in probes.values())
    print(f"\n{len(probes)} requests sent as a failover ended: all answered")


def test_a_worker_sigkilled_mid_stream_costs_every_client_nothing_of_the_real_models_answer(ha: HAStack, expected):
    headers = {"Authorization": f"Bearer {ha.env['BRIGADE_API_KEY']}"}
    ha.wait_ready()

    def fault(clients):
        rids = [c.answer.request_id for c in clients]
        wait_until(lambda: claimed(ha, clients), 10, what="every request claimed")
        victim = busiest(ha, rids)
        affected = [c for c in clients if c.answer.request_id in victim["requests"] and c.answer.end is None]
        ha.kill(ha.workers[victim["worker"]])
        return victim["worker"], affected

    clients, (victim, affected) = asyncio.run(stream_clients(ha.url, fault, headers=headers))
    try:
        assert affected, "the killed worker held none of the requests"
        assert_complete(clients, expected, ha)  # done, indexes whole, the uninterrupted text
        assert all(c.answer.end["timing"]["worker"] != victim for c in affected)
    finally:
        ha.start_worker(victim)
        ha.wait_ready()


# ---- a worker SIGKILLed mid-stream of a sampled request with n = 2 and logprobs ------------------

SAMPLED = {"type": "generate", "id": "s", "messages": [{"role": "user", "content": PROMPTS[1]}], "n": 2,
           "temperature": 1.0, "seed": 11, "logprobs": 2, "ignore_eos": True, "max_tokens": 96}


async def sampled_events(url: str, headers: dict, frame: dict, fault=None, tokens_first: int = 8):
    """One request's events on one WebSocket (after `queued`); `fault(request_id)` runs in a thread
    once its first `tokens_first` tokens have come. Returns the request id, the events, what
    `fault` returned."""
    events, rid, faulted = [], None, None
    async with connect(url, additional_headers=headers, max_size=None) as ws:
        await ws.send(json.dumps(frame))
        while not events or events[-1]["type"] not in ("done", "error"):
            event = json.loads(await asyncio.wait_for(ws.recv(), 180))
            if event["type"] == "queued":
                rid = event["request_id"]
                continue
            events.append(event)
            if fault is not None and faulted is None and len(events) == tokens_first:
                faulted = await asyncio.to_thread(fault, rid)
    return rid, events, faulted


def per_choice(tokens: list[dict]) -> dict[int, list[tuple]]:
    """Each choice's tokens in the order they came: (text, logprobs, finish_reason)."""
    out: dict[int, list[tuple]] = {}
    for e in tokens:
        out.setdefault(e["choice"], []).append((e["text"], e["logprobs"], e.get("finish_reason")))
    return out


def test_a_sigkilled_workers_sampled_n2_answer_with_logprobs_goes_on_token_for_token(ha: HAStack):
    """Seeded sampling with n = 2, logprobs and ignore_eos, its worker SIGKILLed mid-stream: each
    choice continues from its own logged tokens on the other worker, and the client gets exactly
    what the same request gives uninterrupted: every choice's texts and logprobs, its end, usage."""
    key = ha.env.get("BRIGADE_API_KEY") or create_key(ha.redis.url, "sampled")  # this test alone: a key of its own
    headers = {"Authorization": f"Bearer {key}"}
    ha.wait_ready()
    _, whole, _ = asyncio.run(sampled_events(ha.url, headers, SAMPLED))
    assert whole[-1]["type"] == "done", whole[-1]
    n_tokens = 2 * SAMPLED["max_tokens"]
    assert len(whole) == n_tokens + 1 and [e["index"] for e in whole[:-1]] == list(range(n_tokens))
    expected = per_choice(whole[:-1])
    assert sorted(expected) == [0, 1] and expected[0] != expected[1]  # sampled: two different answers
    assert all(len(x[1]["top"]) == 2 for c in expected.values() for x in c)

    def fault(rid: str):
        victim = wait_until(lambda: ha.claimant(rid), 10, what="the request claimed")["worker"]
        ha.kill(ha.workers[victim])
        return victim

    rid, events, victim = asyncio.run(sampled_events(ha.url, headers, SAMPLED, fault))
    try:
        assert victim is not None, events
        done, tokens = events[-1], events[:-1]
        assert done["type"] == "done", f"{done}\n{ha.tails()}"
        assert done["timing"]["worker"] != victim  # the kill landed mid-stream: another worker ended it
        # ...continuing from the log (the same seeds would also give these tokens if it started again)
        survivor = ha.workers[done["timing"]["worker"]].log_path.read_text()
        claimed = re.search(rf"event=claimed request_id={rid} .* resumed_tokens=(\d+)", survivor)
        assert claimed and int(claimed.group(1)) >= 8, survivor[-3000:]
        assert [e["index"] for e in tokens] == list(range(n_tokens))  # one log, no gap, no repeat
        got = per_choice(tokens)
        for choice in (0, 1):
            assert len(got[choice]) == len(expected[choice]), choice
            for i, (a, b) in enumerate(zip(got[choice], expected[choice])):
                assert a == b, f"choice {choice} token {i}: {a} != {b}"
        assert done["finish_reasons"] == ["length", "length"] and done["finish_reason"] == "length"
        assert done["usage"]["completion_tokens"] == n_tokens
        assert done["usage"]["prompt_tokens"] == whole[-1]["usage"]["prompt_tokens"] > 0
        # The replay log, read back by a `resume`, tells the same events: choice and logprobs included.
        _, replayed, _ = asyncio.run(sampled_events(ha.url, headers, {"type": "resume", "id": rid,
                                                                      "after_index": 9}))
        assert [{**e, "id": "s"} for e in replayed[:-1]] == tokens[10:]
        assert replayed[-1]["finish_reasons"] == ["length", "length"]
    finally:
        if victim is not None:  # None: the request ended before its 8th event, and nothing was killed
            ha.start_worker(victim)
            ha.wait_ready()
