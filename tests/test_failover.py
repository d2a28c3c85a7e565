# Over 400 lines: one module-scoped real stack of two workers that each fault is driven through.
"""Workers die, streams don't: real redis-server, two real `brigade worker` processes, a real
reaper, real gateways and WebSocket clients. Faults are real signals: SIGKILL, SIGTERM,
SIGSTOP/SIGCONT, and a Redis restart. The tiny model answers (what is proven is the mechanics of
continuing a stream, with answers long enough for a fault to land mid-stream); the real model's
own SIGKILL failover is in tests/test_redis_failover.py, on its real-model stack. Every test here
runs on the one fleet these faults break: all are `make test-long`'s."""
from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time

import pytest
from websockets.asyncio.client import connect

from ops.core import redis_keys
from tests.clients import Answer, absorb, ask_once, resume
from tests.services import RedisServer, Stack, http_status, queued_params, wait_until, worker_statuses
from tests.streams import PROMPTS, assert_complete, busiest, claimed, uninterrupted
from tests.streams import stream_clients as streams
from tests.worker_scrapes import Samples, delta, scrape

pytestmark = pytest.mark.long

HEARTBEAT_TTL_S = 3.0
MAX_TOKENS = 300  # about a second or more of streaming: a fault made after a stream's first tokens lands mid-stream


@pytest.fixture(scope="module")
def fleet(tiny_model_dir, tmp_path_factory):
    redis_server = RedisServer(tmp_path_factory.mktemp("fleet-redis"), persistent=True)
    with Stack(
        redis_server, tmp_path_factory.mktemp("fleet-logs"), own_redis=True, BRIGADE_MODEL=str(tiny_model_dir),
        BRIGADE_CACHE_ENABLED="0", BRIGADE_TORCH_THREADS="1", BRIGADE_MAX_WAIT_MS="20",
        BRIGADE_DRAIN_SECONDS="1", BRIGADE_RESUME_GRACE_S="30", BRIGADE_HEARTBEAT_TTL_S=str(HEARTBEAT_TTL_S),
        BRIGADE_UNCLAIMED_AFTER_S="3",
        # Deterministic: a continued answer equals the uninterrupted one (engine/batch_invariance.py).
        BRIGADE_BATCH_INVARIANT="true",
    ) as f:
        f.start_gateway()
        # Two reapers, as an operator may run: each dead worker's requests must still be continued once.
        f.start("reaper")
        f.start("reaper")
        # A second gateway, for another model name, whose only worker (`frozen_worker`) takes nothing.
        f.start_gateway("other", BRIGADE_MODEL_NAME="no-worker-model", BRIGADE_MAX_QUEUE_DEPTH="2")
        f.start_worker("w1@fleet")
        f.start_worker("w2@fleet")
        f.wait_ready(gateways=["gateway"])
        f.wait_healthy(["other"])
        yield f


@pytest.fixture(scope="module")
def expected(tiny_invariant_engine) -> dict[str, str]:
    """What an uninterrupted run says to each prompt (greedy, the workers' deterministic mode)."""
    return uninterrupted(tiny_invariant_engine, MAX_TOKENS)


async def stream_clients(url: str, fault, **options):
    return await streams(url, fault, MAX_TOKENS, **options)


# ---- SIGKILL ----------------------------------------------------------------------------------------

def test_sigkill_mid_stream_every_client_still_gets_the_whole_answer(fleet, expected):
    # Each worker's /metrics before the run (at the address its heartbeat gives): the survivor
    # must count each request it continued as a failover, and time only its own first tokens.
    before = {n: scrape(s["metrics_url"]) for n, s in fleet.statuses().items()}

    def fault(clients):
        rids = [c.answer.request_id for c in clients]
        wait_until(lambda: claimed(fleet, clients), 10, what="every request claimed")
        victim = busiest(fleet, rids)
        affected = [c for c in clients if c.answer.request_id in victim["requests"] and c.answer.end is None]
        killed_at = time.monotonic()
        fleet.kill(fleet.workers[victim["worker"]])
        return victim["worker"], killed_at, affected

    clients, (victim, killed_at, affected) = asyncio.run(stream_clients(fleet.url, fault))
    try:
        assert affected, "the killed worker held none of the requests"
        assert_complete(clients, expected, fleet)
        gaps = {c.id: round(min(t for t in c.times if t > killed_at) - killed_at, 3) for c in affected}
        print(f"\nkill-to-next-token seconds per affected client: {json.dumps(gaps)}")
        for c in affected:
            after = [t for t in c.times if t > killed_at]
            assert after, f"{c.id}: no token after the kill"
            # The one timing in the suite, because it is the failover's contract: heartbeat TTL
            # (3 s) + reaper interval + a prefill must stay well inside 3x the TTL.
            assert after[0] - killed_at < 3 * HEARTBEAT_TTL_S, f"{c.id}: {after[0] - killed_at:.2f}s to the next token"
            assert c.answer.end["timing"]["worker"] != victim
        survivor = next(n for n in before if n != victim)
        assert_survivor_counted(fleet, clients, affected, survivor, before[survivor])
    finally:
        fleet.start_worker(victim)
        fleet.wait_ready(gateways=["gateway"])


def assert_survivor_counted(fleet, clients, affected, survivor: str, before: Samples) -> None:
    """The survivor's failovers are the requests it continued (claimed a second time, after the
    kill), and its first-token count only the requests it ran from their start: the continued
    ones' first tokens came from the killed worker."""
    client = fleet.redis.client
    attempts = {c.id: int(client.hget(redis_keys.claim(c.answer.request_id), "attempts")) for c in clients}
    by_survivor = [c.id for c in clients if c.answer.end["timing"]["worker"] == survivor]
    continued = sorted(i for i in by_survivor if attempts[i] > 1)
    assert continued == sorted(c.id for c in affected), (continued, attempts)
    was = {survivor: before}

    def counted():
        now = {survivor: scrape(fleet.statuses([survivor])[survivor]["metrics_url"])}
        return now if delta(was, now, "brigade_failovers_total") >= len(continued) else None

    now = wait_until(counted, 30, what="the survivor to count its failovers")
    assert delta(was, now, "brigade_failovers_total") == len(continued)
    own = [i for i in by_survivor if attempts[i] == 1]
    assert delta(was, now, "brigade_time_to_first_token_seconds_count") == len(own)


# ---- SIGTERM ----------------------------------------------------------------------------------------

def test_sigterm_drains_the_worker_and_its_requests_continue_elsewhere(fleet, expected):
    def fault(clients):
        rids = [c.answer.request_id for c in clients]
        wait_until(lambda: claimed(fleet, clients), 10, what="every request claimed")
        victim = busiest(fleet, rids)
        code = fleet.kill(fleet.workers[victim["worker"]], signal.SIGTERM, timeout=60)
        return victim["worker"], code

    clients, (victim, code) = asyncio.run(stream_clients(fleet.url, fault))
    try:
        assert code == 0, fleet.workers[victim].tail()
        assert_complete(clients, expected, fleet)
        text = fleet.workers[victim].log_path.read_text()
        assert "event=draining" in text and "event=drained" in text, text[-3000:]
    finally:
        fleet.start_worker(victim)
        fleet.wait_ready(gateways=["gateway"])


# ---- a stalled worker is fenced --------------------------------------------------------------------

def test_a_stalled_worker_is_fenced_and_its_late_events_never_reach_the_client(fleet, expected):
    def fault(clients):
        client = clients[0]
        rid = client.answer.request_id
        # Its claim names the worker as it takes the request; a beat lists it only a beat later, and
        # the tiny model may be well into its answer by then.
        holder = wait_until(lambda: fleet.claimant(rid), 10, what="the worker that claimed the request")
        pid = holder["pid"]
        os.kill(pid, signal.SIGSTOP)
        try:
            seen = len(client.answer.tokens)
            # Another worker takes over: tokens flow again while the stalled one is frozen.
            wait_until(lambda: len(client.answer.tokens) > seen + 3 or client.answer.end, 60, what="the takeover")
        finally:
            os.kill(pid, signal.SIGCONT)
        return holder["worker"], rid

    clients, (stalled, rid) = asyncio.run(stream_clients(fleet.url, fault, n=1))
    assert_complete(clients, expected, fleet)
    assert clients[0].answer.end["timing"]["worker"] != stalled
    # The stalled worker woke up, tried to publish, found its claim taken over and stopped.
    wait_until(lambda: f"event=fenced request_id={rid}" in fleet.workers[stalled].log_path.read_text(), 20,
               what="the stalled worker to notice it was fenced")
    # And nothing it produced after the takeover reached the replay log: epochs only grow.
    epochs = [json.loads(f["event"]).get("epoch") for _, f in fleet.redis.client.xrange(redis_keys.stream(rid))]
    assert epochs == sorted(epochs) and len(set(epochs)) >= 2, epochs


# ---- resume --------------------------------------------------------------------------------------------

def test_resume_on_another_gateway_returns_exactly_the_missing_tokens(fleet, expected):
    async def main():
        async with connect(fleet.url) as ws:
            await ws.send(json.dumps({"type": "generate", "id": "c0", "max_tokens": MAX_TOKENS,
                                      "messages": [{"role": "user", "content": PROMPTS[0]}]}))
            first = {"c0": Answer("c0")}
            while len(first["c0"].tokens) < 5:
                absorb(first, json.loads(await ws.recv()))
        # Disconnected mid-stream. Tokens go on into the replay log; the client comes back elsewhere.
        await asyncio.sleep(0.5)
        a = first["c0"]
        async with connect(fleet.gateways["other"].ws_url) as ws:
            await ws.send(json.dumps({"type": "resume", "id": a.request_id, "after_index": a.indexes[-1]}))
            rest = {a.request_id: Answer(a.request_id)}
            while rest[a.request_id].end is None:
                absorb(rest, json.loads(await asyncio.wait_for(ws.recv(), 60)))
        return a, rest[a.request_id]

    first, rest = asyncio.run(main())
    assert rest.end["type"] == "done", rest.end
    indexes = first.indexes + rest.indexes
    assert indexes == list(range(len(indexes))), indexes
    assert first.text + rest.text == expected["c0"]


def test_resume_of_an_unknown_request_is_an_error(fleet):
    async def main():
        async with connect(fleet.url) as ws:
            await ws.send(json.dumps({"type": "resume", "id": "no-such-request", "after_index": 3}))
            return json.loads(await asyncio.wait_for(ws.recv(), 10))

    event = asyncio.run(main())
    assert event["type"] == "error" and event["code"] == "unknown_request" and event["id"] == "no-such-request"


# ---- poison ----------------------------------------------------------------------------------------

POISON = "Write a very long and detailed essay about the history of the Roman Empire."


def test_a_request_that_kills_every_worker_ends_in_the_dead_letter_list(fleet):
    """The 'poison' is played by the test: whichever worker takes the request is SIGKILLed, and
    restarted so the fleet stays whole. After max_attempts (3) claims it must stop going round."""
    kills: list[str] = []

    def killer(rid: str, stop: list[bool]):
        while not stop[0]:
            # The claim, not the heartbeat: a beat lists the request up to a second late, and a
            # worker continuing it can write the rest of its 500 tokens in less (seen on 2 cores).
            # Only once its engine computes the request: a death before that is no attempt.
            # Both from one read of the claim: read apart, a flag left by the killed owner's run
            # once met the next owner's fresh claim, and its death (no attempt) was counted as one.
            owner, engaged = fleet.redis.client.hmget(redis_keys.claim(rid), "owner", "engaged")
            holder = next((s for s in worker_statuses(fleet.redis.client) if s.get("instance") == owner),
                          None) if owner and engaged == "1" else None
            if holder is not None and holder["worker"] in fleet.workers:
                proc = fleet.workers[holder["worker"]].proc
                if proc.pid == holder["pid"] and proc.poll() is None:
                    proc.kill()
                    proc.wait(10)
                    kills.append(holder["worker"])
                    fleet.start_worker(holder["worker"])
            time.sleep(0.05)

    async def main():
        async with connect(fleet.url) as ws:
            await ws.send(json.dumps({"type": "generate", "id": "poison", "max_tokens": 500, "messages": [
                {"role": "user", "content": POISON}]}))
            answers = {"poison": Answer("poison")}
            while answers["poison"].request_id is None:
                absorb(answers, json.loads(await ws.recv()))
            stop = [False]
            thread = asyncio.create_task(asyncio.to_thread(killer, answers["poison"].request_id, stop))
            try:
                while answers["poison"].end is None:
                    absorb(answers, json.loads(await asyncio.wait_for(ws.recv(), 120)))
            finally:
                stop[0] = True
                await thread
            return answers["poison"]

    try:
        answer = asyncio.run(main())
        assert answer.end["type"] == "error" and answer.end["code"] == "worker_failed", answer.end
        assert len(kills) == 3, kills
        listing = subprocess.run([sys.executable, "-m", "ops.commands.cli", "dlq", "list"], env=fleet.env,
                                 capture_output=True, text=True, timeout=60)
        entries = [json.loads(line) for line in listing.stdout.splitlines()]
        assert [e["request_id"] for e in entries] == [answer.request_id], listing.stdout + listing.stderr
        assert entries[0]["attempts"] == 3 and entries[0]["messages"][0]["content"] == POISON
        fleet.wait_ready(gateways=["gateway"])
        # An operator retries it (the "poison" is gone now); the client follows it with resume.
        retried = subprocess.run([sys.executable, "-m", "ops.commands.cli", "dlq", "retry", answer.request_id], env=fleet.env,
                                 capture_output=True, text=True, timeout=60)
        assert retried.returncode == 0 and fleet.redis.client.llen(redis_keys.DEAD_LETTERS) == 0, retried.stdout
        rest = asyncio.run(resume(fleet.url, answer.request_id, answer.indexes[-1] if answer.tokens else -1))
        assert rest.end["type"] == "done", rest.end
        indexes = answer.indexes + rest.indexes
        assert indexes == list(range(len(indexes))) and len(indexes) == rest.end["usage"]["completion_tokens"]
        # And `drop` forgets an entry.
        fleet.redis.client.lpush(redis_keys.DEAD_LETTERS, json.dumps({"request_id": "x", "attempts": 3, "reason": "t", "at": 0}))
        dropped = subprocess.run([sys.executable, "-m", "ops.commands.cli", "dlq", "drop", "x"], env=fleet.env,
                                 capture_output=True, text=True, timeout=60)
        assert dropped.returncode == 0 and fleet.redis.client.llen(redis_keys.DEAD_LETTERS) == 0, dropped.stdout
    finally:
        fleet.wait_ready(gateways=["gateway"])


@pytest.fixture
def frozen_worker(fleet, tiny_model_dir):
    """A real worker of the second gateway's model, stopped (SIGSTOP) once it beats: its heartbeat
    stays live for ten minutes while it takes nothing, as a wedged worker's does until it expires,
    so that model's queue only grows. (A model with no live worker at all is refused no_workers.)"""
    with fleet.frozen_worker("frozen", "frozen@fleet", BRIGADE_MODEL_NAME="no-worker-model",
                             BRIGADE_MODEL=str(tiny_model_dir), BRIGADE_HEARTBEAT_TTL_S="600"):
        yield


# ---- a message taken off the queue by a worker that died before claiming it ------------------------

def test_a_request_lost_between_the_queue_and_a_claim_is_sent_again(fleet, frozen_worker):
    """The second gateway's model's worker takes nothing, so its message stays on the queue until the test
    takes it off, as a worker SIGKILLed right after its BRPOP would (its copy then sits in Celery's
    unacked set for the visibility timeout, or is gone). The reaper must queue it again."""
    lists = redis_keys.queue_lists("no-worker-model")
    client = fleet.redis.client

    async def send():
        async with connect(fleet.gateways["other"].ws_url) as ws:
            await ws.send(json.dumps({"type": "generate", "id": "lost", "prompt": "hello", "max_tokens": 4}))
            event = json.loads(await asyncio.wait_for(ws.recv(), 10))
            assert event["type"] == "queued", event
            rid = event["request_id"]
            taken = [m for name in lists for m in [client.rpop(name)] if m]
            assert len(taken) == 1 and rid in taken[0]
            # Within unclaimed_after_s (3 s) + a reaper pass it is back, at the continued priority.
            resent = await asyncio.to_thread(
                wait_until, lambda: [m for m in client.lrange(lists[0], 0, -1) if rid in m], 15, 0.2, "the resend")
            assert f'"id": "{rid}-' in resent[0]  # a new task id for the same request
            return rid

    rid = asyncio.run(send())
    # Leave no queue behind for the overload test: cancelled, it is no longer the reaper's concern.
    client.set(redis_keys.cancelled(rid), "1", ex=60)
    wait_until(lambda: client.zscore(redis_keys.UNCLAIMED, rid) is None, 10, what="the reaper to forget the cancelled request")
    client.delete(*lists)


# ---- overload and deadlines ------------------------------------------------------------------------

def test_gateway_refuses_work_past_the_queue_limit_with_overloaded(fleet, frozen_worker):
    """The second gateway's model's worker takes nothing, so its queue only grows; its limit is 2."""
    async def main():
        async with connect(fleet.gateways["other"].ws_url) as ws:
            events = []
            for i in range(3):
                await ws.send(json.dumps({"type": "generate", "id": f"o{i}", "prompt": "hello", "max_tokens": 4}))
                events.append(json.loads(await asyncio.wait_for(ws.recv(), 10)))
            return events

    events = asyncio.run(main())
    assert [e["type"] for e in events] == ["queued", "queued", "error"], events
    assert events[2]["code"] == "overloaded" and events[2]["id"] == "o2"


def test_a_request_whose_deadline_passed_in_the_queue_is_dropped_before_any_model_work(fleet):
    from ops.core.messages import QueuedRequest
    from ops.core.queue import make_app

    client = fleet.redis.client
    pubsub = client.pubsub(ignore_subscribe_messages=True)
    channel = redis_keys.reply_channel("deadline-test")
    pubsub.subscribe(channel)
    queued = QueuedRequest(
        request_id="late-1", client_id="late-1", reply_channel=channel, enqueued_at=time.time() - 5,
        model="smollm2-135m-instruct", prompt="Hello", params=queued_params(max_tokens=8), deadline_at=time.time() - 1,
    )
    client.set(redis_keys.request("late-1"), queued.model_dump_json(), ex=60)
    make_app(fleet.redis.url).send_task("brigade.generate", args=[queued.model_dump(mode="json")],
                                        queue=redis_keys.interactive_queue("smollm2-135m-instruct"))
    seen: list[dict] = []

    def ended():
        message = pubsub.get_message(timeout=0.5)
        if message and message["type"] == "message":
            seen.append(json.loads(message["data"]))
        return any(e["type"] != "token" for e in seen)

    wait_until(ended, 60, interval=0, what="the late request's answer")
    assert [e["type"] for e in seen] == ["error"] and seen[0]["code"] == "deadline_exceeded", seen


# ---- Celery's redelivery is the second line: its duplicates are harmless ---------------------------

def test_duplicate_deliveries_of_a_running_or_finished_request_are_skipped(fleet, expected):
    """What Celery does after a visibility timeout: deliver the same message again."""
    from ops.core.queue import make_app

    app = make_app(fleet.redis.url)

    def fault(clients):
        rid = clients[0].answer.request_id
        payload = json.loads(fleet.redis.client.get(redis_keys.request(rid)))
        app.send_task("brigade.generate", args=[payload], queue=redis_keys.interactive_queue("smollm2-135m-instruct"))
        return rid, payload

    clients, (rid, payload) = asyncio.run(stream_clients(fleet.url, fault, n=1))
    assert_complete(clients, expected, fleet)
    app.send_task("brigade.generate", args=[payload], queue=redis_keys.interactive_queue("smollm2-135m-instruct"))
    logs = lambda: "".join(p.log_path.read_text() for p in fleet.workers.values())  # noqa: E731
    wait_until(lambda: logs().count(f"event=claim_skipped request_id={rid}") >= 2, 30, what="both duplicates skipped")
    assert f"request_id={rid} outcome=busy" in logs() and f"request_id={rid} outcome=done" in logs()
    tokens = [json.loads(f["event"]) for _, f in fleet.redis.client.xrange(redis_keys.stream(rid))]
    indexes = [e["index"] for e in tokens if e["type"] == "token"]
    assert indexes == list(range(len(indexes))) and [e["type"] for e in tokens].count("done") == 1


# ---- Redis restart -----------------------------------------------------------------------------------

def test_redis_restart_mid_stream_the_service_recovers_and_no_stream_breaks(fleet, expected):
    """Redis keeps an append-only file here, as in production: every stream in flight finishes
    with the uninterrupted text (docs/reliability.md, "Redis outages"), new work during the outage
    is refused `unavailable`, and /readyz says the truth throughout."""
    seen = {}

    def fault(clients):
        fleet.redis.stop()
        seen["refused"] = asyncio.run(ask_once(fleet.url))  # new work while Redis is gone
        # Down longer than the heartbeat TTL, so that readiness after the restart needs fresh beats.
        time.sleep(HEARTBEAT_TTL_S + 1)
        seen["ready_while_down"] = http_status(fleet.port, "/readyz")
        fleet.redis.start()
        back = time.monotonic()
        wait_until(lambda: http_status(fleet.port, "/readyz") == 200, 60, interval=0.1,
                   what="/readyz after Redis returned")
        print(f"\nready again {time.monotonic() - back:.2f}s after Redis returned")

    clients, _ = asyncio.run(stream_clients(fleet.url, fault, n=4))
    assert seen["ready_while_down"] == 503, seen  # /readyz tells the truth while Redis is gone
    assert seen["refused"]["type"] == "error" and seen["refused"]["code"] == "unavailable", seen
    assert_complete(clients, expected, fleet)
    # And the service answers new requests.
    fresh, _ = asyncio.run(stream_clients(fleet.url, lambda clients: None, n=1))
    assert_complete(fresh, expected, fleet)


# ---- the other doors ----------------------------------------------------------------------------------

def test_a_stopping_gateway_closes_websockets_with_1012_and_the_request_is_resumed_elsewhere(fleet, expected):
    from websockets.exceptions import ConnectionClosed

    async def main():
        answers = {"c1": Answer("c1")}
        async with connect(fleet.url) as ws:
            await ws.send(json.dumps({"type": "generate", "id": "c1", "max_tokens": MAX_TOKENS,
                                      "messages": [{"role": "user", "content": PROMPTS[1]}]}))
            while len(answers["c1"].tokens) < 4:
                absorb(answers, json.loads(await ws.recv()))
            fleet.gateway.proc.send_signal(signal.SIGTERM)
            try:
                while True:
                    absorb(answers, json.loads(await ws.recv()))
            except ConnectionClosed as exc:
                code = exc.rcvd.code if exc.rcvd else None
        a = answers["c1"]
        # Resume on the other gateway: it follows the replay log from the last index seen.
        async with connect(fleet.gateways["other"].ws_url) as ws:
            await ws.send(json.dumps({"type": "resume", "id": a.request_id, "after_index": a.indexes[-1]}))
            resumed = {a.request_id: a}
            while a.end is None:
                absorb(resumed, json.loads(await asyncio.wait_for(ws.recv(), 120)))
        return code, a

    code, answer = asyncio.run(main())
    try:
        assert code == 1012
        # uvicorn re-raises the SIGTERM once it has shut down cleanly, so the exit is "by SIGTERM".
        assert fleet.gateway.proc.wait(30) in (0, -signal.SIGTERM), fleet.gateway.tail()
        assert "event=gateway_stopping" in fleet.gateway.log_path.read_text()
        assert answer.end["type"] == "done", answer.end
        assert answer.indexes == list(range(len(answer.tokens)))
        assert answer.text == expected["c1"]
    finally:
        fleet.restart_gateway()
