"""What the reaper and the gateway learn from Redis about the workers, cheaply and truthfully:
a heartbeat that vouches for progress (a wedged engine stops it), the registry of live workers,
and the reaper's choice of which unclaimed requests to send again, made without reading the
queue; and a worker that finds a request's claim already its own. A real redis-server; the
engine is the tiny random model in this process, wedged by blocking its decode step (the fault,
not a stand-in for the model)."""
from __future__ import annotations

import json
import threading
import time
import uuid

import pytest
import redis

from ops.core import redis_clients, redis_keys, roster
from ops.core.messages import QueuedRequest
from ops.core.settings import Settings
from tests.services import queued_params, wait_until
from workers.claims import ClaimStore


@pytest.fixture
def settings(redis_server) -> Settings:
    redis_server.client.flushall()
    return Settings(redis_url=redis_server.url, heartbeat_interval_s=0.2, heartbeat_ttl_s=1.0, engine_stall_s=1.5,
                    unclaimed_after_s=0.5, model_name="health-model")


def queued_request(settings: Settings, client: redis.Redis, max_tokens: int = 200, version: str = "") -> QueuedRequest:
    rid = uuid.uuid4().hex
    queued = QueuedRequest(request_id=rid, client_id="c", reply_channel=redis_keys.reply_channel("test-gateway"),
                           enqueued_at=time.time(), model=settings.model_name, version=version, prompt="hello there",
                           params=queued_params(max_tokens=max_tokens, temperature=0.0))
    client.set(redis_keys.request(rid), queued.model_dump_json(), ex=600)
    client.zadd(redis_keys.UNCLAIMED, {rid: queued.enqueued_at})
    return queued


def on_queue(client: redis.Redis, model: str, rid: str, version: str = "") -> bool:
    return any(rid in m for name in redis_keys.queue_lists(model, version) for m in client.lrange(name, 0, -1))


def test_a_wedged_engine_stops_the_heartbeat_and_the_reaper_moves_its_request(
        settings, redis_server, tiny_engine_factory, caplog):
    from workers.engine_host import EngineHost
    from workers.reaper import Reaper

    client = redis_server.client
    engine = tiny_engine_factory(max_batch=4, max_wait_ms=0)
    host = EngineHost(settings, "wedged@test", engine)
    wedge, decoding = threading.Event(), threading.Event()
    real_forward = engine.runner.forward

    def stuck_forward(chunks, *args, **kwargs):
        if all(c.decodes for c in chunks):  # a decode step
            decoding.set()
            wedge.wait(60)  # a forward pass that never returns, as a hung kernel or a deadlock would
        return real_forward(chunks, *args, **kwargs)

    host.start_threads()
    try:
        wait_until(lambda: [w for w in roster.live_workers(client) if w["instance"] == host.instance], 5,
                   what="the first heartbeat")
        queued = queued_request(settings, client)
        served = threading.Thread(target=host.serve, args=(queued,), daemon=True)
        engine.runner.forward = stuck_forward
        served.start()
        wait_until(decoding.is_set, 10, what="the engine to enter a decode step")
        assert client.hget(redis_keys.CLAIMS, queued.request_id) == host.instance
        # The process lives and its heartbeat thread runs, but it no longer vouches for the request.
        wait_until(lambda: not client.exists(redis_keys.worker(host.instance)), settings.engine_stall_s + 5,
                   what="the wedged worker's heartbeat to lapse")
        assert host.heartbeat.thread.is_alive() and host.engine_loop.alive()
        assert "event=engine_stalled" in caplog.text
        assert roster.live_workers(client) == []
        reaper = Reaper(settings, redis_clients.client(settings.redis_url))
        swept = wait_until(lambda: reaper.sweep(), 10, interval=0.2, what="the reaper to act")
        assert swept == {queued.request_id: "requeue"}
        assert on_queue(client, settings.model_name, queued.request_id)
        assert client.hget(redis_keys.claim(queued.request_id), "state") == "queued"
    finally:
        wedge.set()
        host.close()
    # Unwedged, the old owner finds its claim taken over and publishes nothing more for it.
    served.join(10)
    assert not served.is_alive()
    assert "event=fenced request_id=" + queued.request_id in caplog.text


def stream_events(client: redis.Redis, rid: str) -> list[dict]:
    return [json.loads(fields["event"]) for _, fields in client.xrange(redis_keys.stream(rid))]


def test_a_claim_whose_reply_a_failover_lost_is_run_by_its_worker_and_a_second_delivery_is_not(
        settings, redis_server, tiny_engine_factory):
    """The claim ran on a primary that died before its reply came back; the worker's retry, on the
    promoted replica, finds the claim already its own. It must run the request (nobody else will:
    its owner lives), but a request delivered again while one of its threads runs it, only once."""
    from workers.engine_host import EngineHost

    client = redis_server.client
    host = EngineHost(settings, "lost-reply@test", tiny_engine_factory(max_batch=2))
    host.start_threads()
    try:
        wait_until(lambda: client.exists(redis_keys.worker(host.instance)), 5, what="the first heartbeat")
        lost = queued_request(settings, client, max_tokens=6)
        first = host.claims.claim(lost.request_id, host.instance)  # its reply is what the failover lost
        assert first.outcome == "claimed"
        assert host.serve(lost) == "length"
        tokens = [e for e in stream_events(client, lost.request_id) if e["type"] == "token"]
        assert len(tokens) == 6 and all(e["epoch"] == first.epoch for e in tokens)
        assert client.hget(redis_keys.claim(lost.request_id), "state") == "done"

        twice = queued_request(settings, client, max_tokens=40)
        running = threading.Thread(target=host.serve, args=(twice,), daemon=True)
        running.start()
        wait_until(lambda: twice.request_id in host.held, 10, what="the first delivery to be running")
        assert host.serve(twice) == "busy"  # the second delivery, while the first runs
        running.join(30)
        events = stream_events(client, twice.request_id)
        assert [e["index"] for e in events if e["type"] == "token"] == list(range(40))
        assert [e["type"] for e in events].count("done") == 1
    finally:
        host.close()


def test_an_idle_engine_keeps_beating(settings, redis_server, tiny_engine_factory):
    """The converse: no requests for longer than engine_stall_s is not a stall."""
    from workers.engine_host import EngineHost

    client = redis_server.client
    host = EngineHost(settings, "idle@test", tiny_engine_factory(max_batch=2))
    host.start_threads()
    try:
        wait_until(lambda: client.exists(redis_keys.worker(host.instance)), 5, what="the first heartbeat")
        deadline = time.monotonic() + settings.engine_stall_s * 2
        while time.monotonic() < deadline:
            assert client.exists(redis_keys.worker(host.instance)), "an idle worker stopped beating"
            time.sleep(0.2)
    finally:
        host.close()
    # A clean stop leaves the registry at once.
    assert client.zscore(redis_keys.WORKERS, host.instance) is None
    assert not client.exists(redis_keys.worker(host.instance))


def test_the_registry_lists_live_workers_without_scanning_the_keyspace(settings, redis_server):
    client = redis_server.client
    # A cache-sized keyspace beside the workers: readers must not walk it.
    pipe = client.pipeline(transaction=False)
    for i in range(20_000):
        pipe.set(f"{redis_keys.PREFIX}:cache:entry:{i}", "x")
    pipe.execute()
    now = time.time()
    for name, ttl_ms in (("a", 60_000), ("b", 60_000), ("gone", 1)):
        pipe = client.pipeline()
        roster.record_beat(pipe, name, {"instance": name, "worker": name}, ttl_ms, now)
        pipe.execute()
    client.zadd(redis_keys.WORKERS, {"forgotten": now - roster.FORGET_S - 5})
    time.sleep(0.05)
    client.config_resetstat()
    assert sorted(w["instance"] for w in roster.live_workers(client)) == ["a", "b"]
    stats = client.info("commandstats")
    assert "cmdstat_scan" not in stats and "cmdstat_keys" not in stats, stats
    calls = {k: v["calls"] for k, v in stats.items() if not k.startswith(("cmdstat_info", "cmdstat_config"))}
    assert calls == {"cmdstat_zrange": 1, "cmdstat_mget": 1}, calls
    # A pruning beat (one in PRUNE_EVERY) drops members silent for longer than FORGET_S.
    pipe = client.pipeline()
    roster.record_beat(pipe, "a", {"instance": "a"}, 60_000, now)
    pipe.execute()
    assert client.zscore(redis_keys.WORKERS, "forgotten") is None
    assert client.zscore(redis_keys.WORKERS, "gone") is not None  # recent: kept, but read as dead


def test_the_reaper_resends_unclaimed_requests_by_who_received_them_not_by_reading_the_queue(
        settings, redis_server):
    from workers.reaper import Reaper

    settings = settings.model_copy(update={"unclaimed_after_s": 60.0})
    client = redis_server.client
    claims = ClaimStore.from_settings(redis_clients.client(settings.redis_url), settings)
    pipe = client.pipeline()
    roster.record_beat(pipe, "alive#1", {"instance": "alive#1"}, 60_000, time.time())
    pipe.execute()
    backlog = redis_keys.queue_lists(settings.model_name)[2]
    # Messages from a sender older than the time stamp (SENT_HEADER): each may be older than anything.
    client.lpush(backlog, *[json.dumps({"body": f"someone else's request {i}"}) for i in range(1000)])

    waiting = queued_request(settings, client)  # never received by a worker: still on the (long) queue
    prefetched = queued_request(settings, client)  # held by a live worker's prefetch
    claims.mark_taken(prefetched.request_id, "alive#1")
    orphaned = queued_request(settings, client)  # received by a worker that died before claiming it
    claims.mark_taken(orphaned.request_id, "dead#1")
    for q in (waiting, prefetched, orphaned):
        client.zadd(redis_keys.UNCLAIMED, {q.request_id: 0})  # queued long ago

    reaper = Reaper(settings, redis_clients.client(settings.redis_url))
    wait_until(lambda: reaper._heartbeats_trustworthy(), 5, what="the reaper to trust heartbeats")
    client.config_resetstat()
    assert reaper.sweep() == {orphaned.request_id: "unclaimed"}
    assert "cmdstat_lrange" not in client.info("commandstats")
    assert on_queue(client, settings.model_name, orphaned.request_id)
    assert client.hget(redis_keys.TAKEN, orphaned.request_id) is None  # the dead receiver's mark went with it
    assert reaper.sweep() == {}  # the others are looked at again later, not resent

    # Once the queue is empty, a request no worker received was lost between a pop and its receipt.
    client.zadd(redis_keys.UNCLAIMED, {orphaned.request_id: time.time() + 3600})  # (claimed: out of the way)
    client.delete(*redis_keys.queue_lists(settings.model_name))
    client.zadd(redis_keys.UNCLAIMED, {waiting.request_id: 0})
    assert reaper.sweep() == {waiting.request_id: "unclaimed"}
    # A live worker's prefetched request is never resent while it lives.
    client.zadd(redis_keys.UNCLAIMED, {prefetched.request_id: 0})
    assert reaper.sweep() == {}
    client.zrem(redis_keys.UNCLAIMED, orphaned.request_id)
    # A claim clears the receiver's mark.
    claims.claim(prefetched.request_id, "alive#1")
    assert client.hget(redis_keys.TAKEN, prefetched.request_id) is None


def test_the_reaper_looks_at_and_refills_the_queue_of_each_requests_own_version(settings, redis_server):
    from workers.reaper import Reaper

    settings = settings.model_copy(update={"unclaimed_after_s": 60.0})
    client = redis_server.client
    model = settings.model_name
    claims = ClaimStore.from_settings(redis_clients.client(settings.redis_url), settings)
    # Another version's backlog (and the unversioned one's) says nothing about a v2 request's message.
    client.lpush(redis_keys.queue_lists(model)[2], json.dumps({"body": "an unversioned request"}))
    client.lpush(redis_keys.queue_lists(model, "v3")[2], json.dumps({"body": "a v3 request"}))
    lost_v2 = queued_request(settings, client, version="v2")  # popped by a worker killed before its receipt
    waiting_v3 = queued_request(settings, client, version="v3")  # still behind v3's backlog
    for q in (lost_v2, waiting_v3):
        client.zadd(redis_keys.UNCLAIMED, {q.request_id: 0})

    reaper = Reaper(settings, redis_clients.client(settings.redis_url))
    wait_until(lambda: reaper._heartbeats_trustworthy(), 5, what="the reaper to trust heartbeats")
    assert reaper.sweep() == {lost_v2.request_id: "unclaimed"}  # v2's queue was empty
    assert on_queue(client, model, lost_v2.request_id, "v2")
    assert not on_queue(client, model, lost_v2.request_id) and not on_queue(client, model, lost_v2.request_id, "v3")
    assert not any(on_queue(client, model, waiting_v3.request_id, v) for v in ("", "v2", "v3"))
    # A v2 request whose claim's owner died goes back to v2's queue too.
    running_v2 = queued_request(settings, client, version="v2")
    assert claims.claim(running_v2.request_id, "dead#2").outcome == "claimed"
    assert reaper.sweep() == {running_v2.request_id: "requeue"}
    assert on_queue(client, model, running_v2.request_id, "v2") and not on_queue(client, model, running_v2.request_id)
    # v3's queue emptied (its backlog taken, the request's message lost with it): now it is resent, to v3.
    client.delete(*redis_keys.queue_lists(model, "v3"))
    client.zadd(redis_keys.UNCLAIMED, {waiting_v3.request_id: 0})
    assert reaper.sweep() == {waiting_v3.request_id: "unclaimed"}
    assert on_queue(client, model, waiting_v3.request_id, "v3")


def sent_message(rid: str, sent_at: float) -> str:
    """A message as QueueSender.send makes it, as far as the reaper reads one: its headers."""
    from ops.core.queue import RID_HEADER, SENT_HEADER
    return json.dumps({"body": "...", "headers": {"id": rid, RID_HEADER: rid, SENT_HEADER: sent_at}})


def test_a_request_popped_and_never_received_is_sent_again_within_seconds_while_newer_work_fills_its_queue(
        settings, redis_server):
    """The chaos run's lost request (shared/evidence/chaos-2026-12-07): a BRPOP answered while the
    worker's connection was being torn down in a failover, or a worker killed between its pop and
    its receipt, leaves the request on no list and taken by nobody. Under steady load the queue is
    never empty, which the reaper used to read as 'still waiting': it waited for ever."""
    from workers.reaper import Reaper

    client = redis_server.client
    model = settings.model_name
    now = time.time()
    lost = queued_request(settings, client)  # popped at once: its message is on no list
    client.zadd(redis_keys.UNCLAIMED, {lost.request_id: now - 10})
    behind = queued_request(settings, client)  # still waits, behind an older message
    client.zadd(redis_keys.UNCLAIMED, {behind.request_id: now - 10})
    # The shared queue holds newer requests only; a worker's own queue (of the same version) holds
    # one sent before `behind`, so `behind` may still wait there, or behind it.
    client.lpush(redis_keys.queue_lists(model)[2], *[sent_message(f"newer-{i}", now - 1) for i in range(50)])
    client.hset(redis_keys.WORKER_QUEUES, "busy#1", json.dumps({"model": model, "version": ""}))
    pipe = client.pipeline()
    roster.record_beat(pipe, "busy#1", {"instance": "busy#1"}, 60_000, now)
    pipe.execute()
    client.lpush(redis_keys.worker_queue_lists(model, "", "busy#1")[2], sent_message("older", now - 11))

    reaper = Reaper(settings, redis_clients.client(settings.redis_url))
    assert reaper.queues.sweep() == {}  # a message as old as both still waits: either may be behind it
    client.delete(*redis_keys.worker_queue_lists(model, "", "busy#1"))  # the busy worker took it
    assert reaper.queues.sweep() == {lost.request_id: "unclaimed", behind.request_id: "unclaimed"}
    assert on_queue(client, model, lost.request_id)
    # Within the clocks' allowed skew a newer message may still be behind one sent a little later.
    recent = queued_request(settings, client)
    client.zadd(redis_keys.UNCLAIMED, {recent.request_id: now - 2})
    client.lpush(redis_keys.queue_lists(model)[2], sent_message("skewed", now - 2 + settings.queue_clock_skew_s / 2))
    client.delete(redis_keys.queue_lists(model)[0])  # (the resends)
    assert reaper.queues.sweep() == {}


def test_a_request_whose_receiver_died_is_sent_again_as_its_heartbeat_expires_whatever_its_age(
        settings, redis_server):
    """The chaos run's other request: received by a worker killed a moment later, it was sent again
    only once it had waited unclaimed_after_s (30 s then). The receiver's mark is enough."""
    from workers.reaper import Reaper

    settings = settings.model_copy(update={"unclaimed_after_s": 3600.0})
    client = redis_server.client
    claims = ClaimStore.from_settings(redis_clients.client(settings.redis_url), settings)
    pipe = client.pipeline()
    roster.record_beat(pipe, "alive#1", {"instance": "alive#1"}, 60_000, time.time())
    pipe.execute()
    orphaned, held = queued_request(settings, client), queued_request(settings, client)  # just queued
    claims.mark_taken(orphaned.request_id, "killed#1")
    claims.mark_taken(held.request_id, "alive#1")
    reaper = Reaper(settings, redis_clients.client(settings.redis_url))
    assert reaper.queues.sweep() == {orphaned.request_id: "unclaimed"}
    assert on_queue(client, settings.model_name, orphaned.request_id)
    assert client.hgetall(redis_keys.TAKEN) == {held.request_id: "alive#1"}
    assert reaper.queues.sweep() == {}  # once: the mark went with the resend


def test_a_dead_workers_own_queue_goes_back_to_the_shared_queue_in_order_and_ahead_of_newer_work(
        settings, redis_server):
    from workers.reaper import Reaper

    client = redis_server.client
    model = settings.model_name
    now = time.time()
    own = redis_keys.worker_queue_lists(model, "", "gone#1")
    client.lpush(own[2], *[sent_message(f"routed-{i}", now - 5 + i) for i in range(3)])  # routed-0 oldest
    client.lpush(redis_keys.queue_lists(model)[2], sent_message("newer", now))
    client.hset(redis_keys.WORKER_QUEUES, "gone#1", json.dumps({"model": model, "version": ""}))
    client.zadd(redis_keys.WORKERS, {"gone#1": now})  # in the registry, its heartbeat expired
    client.sadd(redis_keys.kombu_bindings(redis_keys.worker_queue(model, "", "gone#1"))[0], "binding")
    reaper = Reaper(settings, redis_clients.client(settings.redis_url))
    reaper.queues.sweep()
    popped = [json.loads(client.rpop(redis_keys.queue_lists(model)[2]))["headers"]["id"] for _ in range(4)]
    assert popped == ["routed-0", "routed-1", "routed-2", "newer"]
    assert client.hexists(redis_keys.WORKER_QUEUES, "gone#1")  # kept while the registry remembers it
    client.zrem(redis_keys.WORKERS, "gone#1")
    reaper.queues.sweep()
    assert not client.hexists(redis_keys.WORKER_QUEUES, "gone#1")
    assert not client.exists(*redis_keys.kombu_bindings(redis_keys.worker_queue(model, "", "gone#1")))
