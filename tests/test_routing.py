"""Prefix-aware routing on real processes (docs/scaling.md): a real redis-server, two real
`brigade worker` processes of the tiny model (the default model's tokenizer and chat template), the
real gateway over real WebSockets and a reaper; the gateway and each worker in a network namespace
of their own, as on separate hosts, sharing the one Redis. A conversation's next turn goes to the worker whose
prefix cache holds its history; killing that worker sends the next turn to the other, whole; an
idle worker takes a request routed to a busy one."""
from __future__ import annotations

import asyncio
import json
import re
import signal
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass

import pytest

from ops.core import redis_keys
from ops.core.messages import QueuedRequest
from ops.core.queue import QueueSender
from ops.core.settings import Settings
from tests.clients import ask
from tests.services import RedisServer, Stack, queued_params, wait_until

# About 260 tokens of system prompt: eight blocks of 32, the history a next turn must find.
SYSTEM = " ".join(f"Rule {i}: answer plainly, cite the manual section {i}, and never guess a number." for i in range(16))


@dataclass
class Routed:
    """The module's stack, each part in a network namespace of its own (as on separate hosts:
    ops/bench/netns.py, the links the chaos bench cuts), all on one Redis listening on each link's
    host end: the workers' reports reach the gateway's index through Redis alone."""
    stack: Stack
    url: str  # the gateway's WebSocket, at its namespace's address
    metrics_url: str
    restart_worker: Callable[[str], object]  # a worker started again under its name, in its namespace


@pytest.fixture(scope="module")
def routed(tiny_model_dir, tmp_path_factory):
    from ops.bench.netns import CutLink

    links = {}
    try:
        for tag in ("gw", "r1", "r2"):
            links[tag] = CutLink.create(tag)
        redis_server = RedisServer(tmp_path_factory.mktemp("routing-redis"),
                                   also_bind=tuple(link.host_ip for link in links.values()))

        def inside(tag: str) -> dict:
            return {"wrap": links[tag].command, "BRIGADE_REDIS_URL": f"redis://{links[tag].host_ip}:{redis_server.port}/0"}

        with Stack(redis_server, tmp_path_factory.mktemp("routing-logs"), own_redis=True,
                   BRIGADE_MODEL=str(tiny_model_dir), BRIGADE_CACHE_ENABLED="0", BRIGADE_TORCH_THREADS="1",
                   BRIGADE_MAX_WAIT_MS="5", BRIGADE_HEARTBEAT_TTL_S="2", BRIGADE_ROUTING="prefix",
                   # One task thread each: a worker running one request takes nothing more, so a request
                   # routed to it waits on its own queue (the stealing test's busy worker). A holder
                   # between two tasks takes its next one well within the second it has before the
                   # idle worker may (with one thread, the last one's ack comes first).
                   BRIGADE_WORKER_CONCURRENCY="1", BRIGADE_STEAL_AFTER_S="1") as s:
            # Reached only from this host, over its link: no API key.
            s.start_gateway(**inside("gw"), BRIGADE_GATEWAY_HOST="0.0.0.0", BRIGADE_AUTH="off")
            s.start("reaper")
            for name, tag in (("r1@routing", "r1"), ("r2@routing", "r2")):
                s.start_worker(name, **inside(tag))
            s.wait_ready(gateways=[])  # its /readyz is inside its namespace: asked below, at its own address
            gateway = links["gw"].ns_ip
            here = Routed(s, f"ws://{gateway}:{s.port}/v1/ws", f"http://{gateway}:{s.port}/metrics",
                          lambda name: s.start_worker(name, **inside(name.split("@")[0])))
            wait_until(lambda: metrics_text(here) is not None, 120, 0.5, "the gateway in its namespace")

            def routes() -> bool:
                # Until its load monitor has read both heartbeats (once a second) the gateway knows
                # fewer than two workers, and keeps the shared queue: probe until it routes.
                asyncio.run(ask(here.url, "probe", prompt="A probe.", max_tokens=1, temperature=0))
                return sum(gateway_counter(here, d) for d in ("miss", "prefix_hit", "load_fallback")) > 0

            wait_until(routes, 60, 0.5, "the gateway to route between both workers")
            yield here
    finally:
        for link in links.values():
            link.remove()


def metrics_text(routed: Routed) -> str | None:
    try:
        with urllib.request.urlopen(routed.metrics_url, timeout=5) as r:
            return r.read().decode()
    except OSError:
        return None


def gateway_counter(routed: Routed, decision: str) -> float:
    text = metrics_text(routed) or ""
    found = re.findall(rf'^brigade_routing_decisions_total{{[^}}]*decision="{decision}"[^}}]*}} ([0-9.e+]+)$', text, re.M)
    return sum(float(v) for v in found)


def chat(system: str, turns: list[tuple[str, str]], question: str) -> list[dict]:
    messages = [{"role": "system", "content": system}]
    for asked, answered in turns:
        messages += [{"role": "user", "content": asked}, {"role": "assistant", "content": answered}]
    return messages + [{"role": "user", "content": question}]


async def converse(url: str, name: str, system: str, questions: list[str]) -> list[dict]:
    """Each turn sends the growing history; returns each turn's done event."""
    turns: list[tuple[str, str]] = []
    ends = []
    for i, question in enumerate(questions):
        answer = await ask(url, f"{name}-{i}", messages=chat(system, turns, question), max_tokens=8, temperature=0)
        assert answer.end is not None and answer.end["type"] == "done", answer.end
        turns.append((question, answer.text))
        ends.append(answer.end)
    return ends


def test_each_conversations_next_turns_go_to_the_worker_that_holds_its_history(routed):
    stack = routed.stack
    hits_before = gateway_counter(routed, "prefix_hit")
    systems = [f"Tenant {n}. {SYSTEM}" for n in range(4)]
    questions = ["Where is section 3?", "And section 4?", "Thanks, and 9?"]

    async def main():
        # Four first turns at once, each its own system prompt: they land on whichever worker is
        # free (the shared queue), so both workers hold some.
        firsts = await asyncio.gather(*[ask(routed.url, f"c{n}-0", messages=chat(systems[n], [], questions[0]),
                                            max_tokens=8, temperature=0) for n in range(4)])
        served_by = []
        # The later turns one at a time, so that no holder is busy (one task thread each: a busy
        # holder's routed turn would be taken by the idle one, the last test's case).
        for n, first in enumerate(firsts):
            turns = [(questions[0], first.text)]
            mine = [first.end["timing"]["worker"]]
            for i, question in enumerate(questions[1:], 1):
                answer = await ask(routed.url, f"c{n}-{i}", messages=chat(systems[n], turns, question), max_tokens=8,
                                   temperature=0)
                turns.append((question, answer.text))
                mine.append(answer.end["timing"]["worker"])
            served_by.append(mine)
        return served_by

    served_by = asyncio.run(main())
    for mine in served_by:
        assert mine[1:] == [mine[0]] * 2, served_by  # every later turn where its history is
    assert len({mine[0] for mine in served_by}) == 2, served_by  # the first turns spread over both
    assert gateway_counter(routed, "prefix_hit") - hits_before >= 8
    # The workers' own count (their heartbeats, a second behind): each later turn found its history's blocks.
    statuses = wait_until(lambda: (lambda st: st if sum(s["prefix_hit_tokens"] for s in st.values()) >= 8 * 256
                                   else None)(stack.statuses()), 10, 0.2, "the workers' prefix hits")
    # `brigade status` shows each worker's share of its version's cached prefixes: both hold some.
    from ops.commands.status import collect, render
    report = collect(Settings(redis_url=stack.redis.url, model_name=statuses["r1@routing"]["model"]))
    rows = next(m for m in report["models"] if m["workers"])["workers"]
    shares = [r["prefix_share"] for r in rows]
    assert len(shares) == 2 and all(0 < x < 1 for x in shares) and abs(sum(shares) - 1) < 0.01, rows
    assert "prefixes" in render(report)


def test_the_next_turn_of_a_conversation_whose_worker_was_killed_is_answered_whole_by_the_other(routed):
    stack = routed.stack

    async def first_turns():
        return await converse(routed.url, "k", f"Killed tenant. {SYSTEM}", ["Where is section 5?"])

    (first,) = asyncio.run(first_turns())
    holder = first["timing"]["worker"]
    other = next(n for n in ("r1@routing", "r2@routing") if n != holder)
    stack.kill(stack.workers[holder], signal.SIGKILL)
    try:
        async def next_turn():
            return await converse(routed.url, "k2", f"Killed tenant. {SYSTEM}", ["Where is section 5?", "And 6?"])

        ends = asyncio.run(next_turn())
        assert [e["timing"]["worker"] for e in ends] == [other, other]
        assert all(e["finish_reason"] in ("stop", "length") for e in ends)
    finally:
        routed.restart_worker(holder)
        stack.wait_ready(gateways=[])


def test_an_idle_worker_takes_a_request_routed_to_a_busy_one_that_did_not_take_it(routed):
    stack = routed.stack
    settings = Settings(redis_url=stack.redis.url)
    client = stack.redis.client
    statuses = stack.statuses()
    busy, idle = sorted(statuses)[:2]
    model = statuses[busy]["model"]

    def queued(rid: str, max_tokens: int) -> QueuedRequest:
        q = QueuedRequest(request_id=rid, client_id=rid, reply_channel=redis_keys.reply_channel("routing-test"),
                          enqueued_at=time.time(), model=model, prompt="Tell me a long story.",
                          params=queued_params(max_tokens=max_tokens, temperature=0.0, ignore_eos=True))
        client.set(redis_keys.request(rid), q.model_dump_json(), ex=300)
        client.zadd(redis_keys.UNCLAIMED, {rid: q.enqueued_at})
        return q

    sender = QueueSender(settings)
    pubsub = client.pubsub(ignore_subscribe_messages=True)
    pubsub.subscribe(redis_keys.reply_channel("routing-test"))
    long_rid, routed_rid = f"long-{time.time_ns()}", f"routed-{time.time_ns()}"
    sender.send(queued(long_rid, 2000), first=True, worker=statuses[busy]["instance"])
    wait_until(lambda: long_rid in (stack.statuses()[busy].get("requests") or []), 30, what="the busy worker to run it")
    sender.send(queued(routed_rid, 4), first=True, worker=statuses[busy]["instance"])
    ended: dict[str, dict] = {}

    def routed_done() -> bool:
        # Every event waiting (the long answer's tokens share the channel), not one a poll.
        while (message := pubsub.get_message(timeout=0.05)) is not None:
            if message["type"] == "message":
                event = json.loads(message["data"])
                if event["type"] in ("done", "error"):
                    ended[event["request_id"]] = event
        return routed_rid in ended

    wait_until(routed_done, 30, what="the routed request's answer")
    assert ended[routed_rid]["type"] == "done" and ended[routed_rid]["timing"]["worker"] == idle
    # Taken from the busy worker's own queue (it had no free thread), not handed to the idle one.
    assert "event=routed_requests_stolen count=1" in stack.workers[idle].log_path.read_text()
    client.set(redis_keys.cancelled(long_rid), "1", ex=60)
    client.publish(redis_keys.CANCEL_CHANNEL, long_rid)


def test_a_chat_tokenized_piece_by_remembered_piece_gets_the_ids_of_the_whole_text(model_dir):
    """The router cuts a rendered chat at the tokenizer's added tokens and remembers the pieces (a
    conversation's next turn tokenizes only its new messages): the ids must be the engine's."""
    from gateway.admission.routing import PromptTokens

    tokens = PromptTokens(model_dir, remembered=4)
    tokenizer = tokens.renderer.tokenizer
    chats = [
        [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "Where is section 3?"}],
        [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "Where is section 3?"},
         {"role": "assistant", "content": " It is in part\n two, 3.1 "}, {"role": "user", "content": "Ünïcode ✓ and 数字?"}],
        [{"role": "user", "content": "  leading spaces, a tab\tand <|im_start|> typed by a user"}],
        [{"role": "user", "content": ""}, {"role": "assistant", "content": "x"}, {"role": "user", "content": "\n\n"}],
    ]
    for _ in range(2):  # the second time from remembered pieces (and past the LRU's 4)
        for chat in chats:
            text = tokens.renderer.render(chat)
            assert tokens.encode(text) == tokenizer(text, add_special_tokens=False)["input_ids"], text
    assert len(tokens._pieces) == 4

