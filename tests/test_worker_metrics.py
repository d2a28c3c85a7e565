"""Every worker's Prometheus /metrics, scraped from real processes: a real redis-server, two real
`brigade worker` processes on one host, a real reaper and gateway, real WebSocket clients, the
tiny model (what is counted does not depend on the words). Counts are checked as differences
between two scrapes, summed over the workers, against what the clients and the replay logs saw."""
from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import time
import urllib.parse
from dataclasses import dataclass

import pytest
from websockets.asyncio.client import connect

from ops.core import redis_keys
from tests.clients import Answer, ask, collect_one
from tests.services import Stack, queued_params, wait_until
from tests.worker_scrapes import MODEL, Samples, delta, scrape, value
from tests.worker_scrapes import families as metric_families
from tests.vllm_metric_cases import *  # noqa: F401,F403  (its test runs on this module's fleet)

WORKERS = ("w1@metrics", "w2@metrics")
HISTOGRAMS = {
    "brigade_time_to_first_token_seconds", "brigade_time_per_output_token_seconds",
    "brigade_inter_token_latency_seconds", "brigade_e2e_request_latency_seconds",
    "brigade_request_queue_time_seconds", "brigade_request_prefill_time_seconds", "brigade_batch_size",
}
GAUGES = {"brigade_num_requests_running", "brigade_num_requests_waiting", "brigade_kv_cache_usage_perc"}
COUNTERS = {  # family names; the samples carry _total
    "brigade_prompt_tokens", "brigade_generation_tokens", "brigade_request_success", "brigade_request_errors",
    "brigade_failovers", "brigade_dead_letters", "brigade_lane_requests", "brigade_lane_generation_tokens",
    "brigade_num_preemptions", "brigade_prefix_cache_queries", "brigade_prefix_cache_hits", "brigade_routing_stolen",
}
QUESTIONS = ["What is the capital of France?", "List three colors.", "What is 2 + 2?"]
LONG_PROMPTS = [
    "Write a long story about a dragon who learns to bake bread.",
    "Explain in detail how a steam engine works.",
    "Describe a walk through a busy market in Marrakesh.",
    "Tell me everything you know about the history of tea.",
]


class Fleet(Stack):
    def scrape(self, names=WORKERS) -> dict[str, Samples]:
        """Every live worker's /metrics (of those named), at the address its heartbeat gives."""
        return {n: scrape(s["metrics_url"]) for n, s in self.statuses(names).items()}


@pytest.fixture(scope="module")
def fleet(redis_server, tiny_model_dir, tmp_path_factory):
    # What is counted does not depend on the answers' words: the tiny model, with answers long
    # enough (hundreds of tokens) that a kill lands in the middle of them.
    with Fleet(
        redis_server, tmp_path_factory.mktemp("metrics-logs"), BRIGADE_MODEL=str(tiny_model_dir),
        BRIGADE_CACHE_ENABLED="0", BRIGADE_TORCH_THREADS="1", BRIGADE_MAX_WAIT_MS="20",
        BRIGADE_HEARTBEAT_TTL_S="3", BRIGADE_RESUME_GRACE_S="30", BRIGADE_UNCLAIMED_AFTER_S="3",
        BRIGADE_DRAIN_SECONDS="1",
        BRIGADE_WORKER_METRICS_PORT=None,  # the default (0: any free port) is what is tested
    ) as f:
        f.start_gateway()
        f.start("reaper")
        for name in WORKERS:
            f.start_worker(name)
        f.wait_ready()
        yield f


async def start_streaming(ws, cid: str, prompt: str, tokens_first: int = 3) -> dict[str, Answer]:
    """Send a long chat request and return once its first tokens arrived (or it ended)."""
    await ws.send(json.dumps({"type": "generate", "id": cid, "max_tokens": 1000, "cache": "off",
                              "messages": [{"role": "user", "content": prompt}]}))
    answers = {cid: Answer(cid)}
    while len(answers[cid].tokens) < tokens_first and answers[cid].end is None:
        await collect_one(ws, answers)
    assert answers[cid].end is None, f"{cid} ended before the test could act on it: {answers[cid].end}"
    return answers


def stream_events(client, rid: str) -> list[dict]:
    return [json.loads(f["event"]) for _, f in client.xrange(redis_keys.stream(rid))]


def worker_done(client, rid: str) -> dict | None:
    """The done event the worker wrote into the request's replay log (with its usage)."""
    return next((e for e in stream_events(client, rid) if e["type"] == "done"), None)


# ---- the address ------------------------------------------------------------------------------------

def test_two_workers_on_one_host_serve_metrics_on_their_own_ports_named_in_their_heartbeats(fleet):
    statuses = fleet.statuses(WORKERS)
    urls = {n: s["metrics_url"] for n, s in statuses.items()}
    assert set(urls) == set(WORKERS) and all(urls.values()), urls
    parsed = {n: urllib.parse.urlsplit(u) for n, u in urls.items()}
    assert all(p.hostname == "127.0.0.1" and p.path == "/metrics" for p in parsed.values()), urls
    ports = {p.port for p in parsed.values()}
    assert len(ports) == len(WORKERS) and 0 not in ports, urls
    for name, url in urls.items():
        families = metric_families(url, created=False)
        assert {n for n in families if n.startswith("brigade_")} == HISTOGRAMS | GAUGES | COUNTERS, name
        assert all(families[n].type == "histogram" for n in HISTOGRAMS)
        assert all(families[n].type == "gauge" for n in GAUGES)
        assert all(families[n].type == "counter" for n in COUNTERS)
        # Only the worker's own registry: nothing from prometheus_client's default (process, GC);
        # beside Brigade's names, vLLM's for the same numbers (tests/vllm_metric_cases.py).
        assert not [n for n in families if not n.startswith(("brigade_", "vllm:"))], sorted(families)
        samples = [s for n, f in families.items() if n.startswith("brigade_") for s in f.samples]
        # Unversioned (no BRIGADE_MODEL_VERSION): the version label is there, empty.
        assert samples and all((s.labels.get("model"), s.labels.get("version")) == (MODEL, "") for s in samples)
        assert (statuses[name]["model"], statuses[name]["version"]) == (MODEL, "")


# ---- counts after a known set of requests -------------------------------------------------------------

def test_metrics_count_a_known_set_of_requests(fleet):
    try:
        known = run_a_known_set(fleet)
        assert_requests_counted(known)
        assert_tokens_counted(known)
        assert_latencies_counted(known)
    except BaseException:
        print(fleet.tails())
        raise


@dataclass
class KnownSet:
    """Three greedy answers, one cancelled mid-stream, one refused by the worker; the workers'
    done events for the four that ran, and every worker's /metrics before and after."""
    greedy: list[Answer]
    cancelled: Answer
    refused: Answer
    dones: list[dict]
    before: dict[str, Samples]
    after: dict[str, Samples]

    def delta(self, name: str, **labels: str) -> float:
        return delta(self.before, self.after, name, **labels)


def run_a_known_set(fleet) -> KnownSet:
    client = fleet.redis.client
    wait_until(lambda: all(s["running"] == 0 and s["waiting"] == 0 for s in fleet.statuses(WORKERS).values()),
               30, what="idle workers")
    before = fleet.scrape()

    async def cancelled_one() -> Answer:
        async with connect(fleet.url) as ws:
            answers = await start_streaming(ws, "gone", LONG_PROMPTS[0])
            await ws.send(json.dumps({"type": "cancel", "id": "gone"}))
            while answers["gone"].end is None:
                await collect_one(ws, answers)
            return answers["gone"]

    async def main():
        return await asyncio.gather(
            *[ask(fleet.url, f"g{i}", messages=[{"role": "user", "content": q}], max_tokens=8, cache="off")
              for i, q in enumerate(QUESTIONS)],
            cancelled_one(),
            # Passes the gateway's character limit but not the model's context: the worker refuses it.
            ask(fleet.url, "big", prompt="word " * 12_000, max_tokens=64, cache="off"),
        )

    *greedy, cancelled, refused = asyncio.run(main())
    for a in greedy:
        assert a.end["type"] == "done" and a.end["finish_reason"] in ("stop", "length"), a.end
    assert cancelled.end["finish_reason"] == "cancelled" and cancelled.tokens, cancelled.end
    assert refused.end["type"] == "error" and refused.end["code"] == "context_overflow", refused.end
    ran = [a.request_id for a in [*greedy, cancelled]]
    # The cancelled request's own end (with its usage) is written by the worker after the gateway
    # already answered the client.
    dones = wait_until(lambda: (lambda d: d if all(d) else None)([worker_done(client, r) for r in ran]),
                       30, what="the workers' done events in the replay logs")

    def settled():
        after = fleet.scrape()
        idle = all(value(s, "brigade_num_requests_running") == 0 and value(s, "brigade_num_requests_waiting") == 0
                   for s in after.values())
        counted = delta(before, after, "brigade_request_success_total", finished_reason="cancelled") >= 1
        return after if idle and counted else None
    after = wait_until(settled, 30, what="the workers to go idle with the cancel counted")
    return KnownSet(greedy, cancelled, refused, dones, before, after)


def assert_requests_counted(known: KnownSet) -> None:
    reasons = {r: sum(1 for a in known.greedy if a.end["finish_reason"] == r) for r in ("stop", "length")}
    for reason in ("stop", "length", "cancelled", "error"):
        want = reasons.get(reason, 0) + (reason == "cancelled")
        assert known.delta("brigade_request_success_total", finished_reason=reason) == want, reason
    assert known.delta("brigade_request_errors_total", code="context_overflow") == 1
    error_codes = {dict(k[1]).get("code") for k in {**known.after[WORKERS[0]], **known.after[WORKERS[1]]}
                   if k[0] == "brigade_request_errors_total"}
    assert {c: known.delta("brigade_request_errors_total", code=c) for c in error_codes} == \
        {c: (1 if c == "context_overflow" else 0) for c in error_codes}
    for name, samples in known.after.items():
        assert value(samples, "brigade_num_requests_running") == 0, name
        assert value(samples, "brigade_kv_cache_usage_perc") == 0, name  # an idle engine gives its KV back
    assert known.delta("brigade_failovers_total") == 0


def assert_tokens_counted(known: KnownSet) -> None:
    """Generated tokens: exactly what the done events reported, the cancelled request's included."""
    dones, greedy = known.dones, known.greedy
    generated = sum(d["usage"]["completion_tokens"] for d in dones)
    assert [d["usage"]["completion_tokens"] for d in dones[:3]] == [a.end["usage"]["completion_tokens"] for a in greedy]
    assert [d["usage"]["completion_tokens"] for d in dones[:3]] == [len(a.tokens) for a in greedy]
    assert known.delta("brigade_generation_tokens_total") == generated
    # All of it interactive: by lane, the same counts, and none for the batch lane.
    assert known.delta("brigade_lane_generation_tokens_total", lane="interactive") == generated
    assert known.delta("brigade_lane_requests_total", lane="interactive") == 4
    assert known.delta("brigade_lane_requests_total", lane="batch") == 0
    assert known.delta("brigade_prompt_tokens_total") == sum(d["usage"]["prompt_tokens"] for d in dones)


def assert_latencies_counted(known: KnownSet) -> None:
    """A first token for each request that produced one; the whole-answer latencies for the three
    that ran to their end (not the cancelled one, not the refused one)."""
    dones = known.dones
    generated = sum(d["usage"]["completion_tokens"] for d in dones)
    assert known.delta("brigade_time_to_first_token_seconds_count") == 4
    assert known.delta("brigade_time_to_first_token_seconds_sum") > 0
    for name in ("brigade_e2e_request_latency_seconds", "brigade_request_queue_time_seconds",
                 "brigade_request_prefill_time_seconds"):
        assert known.delta(f"{name}_count") == 3, name
    assert known.delta("brigade_e2e_request_latency_seconds_sum") > 0
    multi = sum(1 for d in dones[:3] if d["usage"]["completion_tokens"] > 1)
    assert known.delta("brigade_time_per_output_token_seconds_count") == multi
    # One gap between each two tokens of a request.
    assert known.delta("brigade_inter_token_latency_seconds_count") == generated - len(dones)
    # Every token after a request's first came from a decode step, one per sequence in its batch.
    assert known.delta("brigade_batch_size_sum") == generated - len(dones)
    assert known.delta("brigade_batch_size_count") >= (generated - len(dones)) / 16


def test_running_and_kv_gauges_show_a_request_in_flight(fleet):
    async def main():
        async with connect(fleet.url) as ws:
            answers = await start_streaming(ws, "busy", LONG_PROMPTS[1])
            rid = answers["busy"].request_id
            holder = await asyncio.to_thread(
                wait_until, lambda: next((n for n, s in fleet.statuses(WORKERS).items() if rid in s["requests"]), None),
                10, 0.1, "the request in a heartbeat")
            seen = scrape(fleet.statuses([holder])[holder]["metrics_url"])
            await ws.send(json.dumps({"type": "cancel", "id": "busy"}))
            while answers["busy"].end is None:
                await collect_one(ws, answers)
            return seen

    seen = asyncio.run(main())
    assert value(seen, "brigade_num_requests_running") == 1
    assert 0 < value(seen, "brigade_kv_cache_usage_perc") <= 1
    wait_until(lambda: all(value(s, "brigade_num_requests_running") == 0 for s in fleet.scrape().values()), 30,
               what="running back to 0")


# ---- dead letters ----------------------------------------------------------------------------------------

def test_a_request_past_its_attempts_is_dead_lettered_and_counted_by_the_worker_that_buried_it(fleet):
    from ops.core.messages import QueuedRequest
    from ops.core.queue import GENERATE_TASK, make_app

    client = fleet.redis.client
    before = fleet.scrape()
    rid = f"poison-{os.getpid()}"
    queued = QueuedRequest(
        request_id=rid, client_id=rid, reply_channel=redis_keys.reply_channel("test-direct"), enqueued_at=time.time(),
        model=MODEL, prompt="Hello", params=queued_params(max_tokens=4),
    )
    client.set(redis_keys.request(rid), queued.model_dump_json(), ex=60)
    # As if it had crashed three workers already (max_attempts is 3): the next claim buries it.
    client.hset(redis_keys.claim(rid), mapping={"state": "queued", "owner": "", "attempts": 3, "epoch": 3})
    make_app(fleet.redis.url).send_task(GENERATE_TASK, args=[queued.model_dump(mode="json")],
                                        queue=redis_keys.interactive_queue(MODEL))
    wait_until(lambda: any(json.loads(e)["request_id"] == rid for e in client.lrange(redis_keys.DEAD_LETTERS, 0, -1)),
               30, what="the request in the dead-letter list")

    def counted():
        after = fleet.scrape()
        return after if delta(before, after, "brigade_dead_letters_total") >= 1 else None
    after = wait_until(counted, 10, what="the dead letter counted")
    assert delta(before, after, "brigade_dead_letters_total") == 1
    assert delta(before, after, "brigade_request_errors_total", code="worker_failed") == 1
    assert delta(before, after, "brigade_failovers_total") == 0  # buried, not continued
    assert [e["code"] for e in stream_events(client, rid) if e["type"] == "error"] == ["worker_failed"]


def test_a_worker_whose_metrics_port_is_taken_logs_it_once_and_serves_without_metrics(fleet):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        # A model of its own, so that the request below can only be its own.
        proc = fleet.start_worker("w3@metrics", BRIGADE_WORKER_METRICS_PORT=str(port), BRIGADE_MODEL_NAME="w3-only")
        status = fleet.wait_ready(["w3@metrics"])["w3@metrics"]
    assert status["metrics_url"] is None, status
    lines = [l for l in proc.log_path.read_text().splitlines() if "event=metrics_unavailable" in l]
    assert len(lines) == 1 and f"port={port}" in lines[0], lines
    # It still serves: a request for its model, through a gateway for that model, ends done by it.
    with fleet.another_gateway("w3-door", BRIGADE_MODEL_NAME="w3-only") as door:
        answer = asyncio.run(ask(door.ws_url, "after", messages=[{"role": "user", "content": "Say hi."}],
                                 max_tokens=4, cache="off"))
    assert answer.end["type"] == "done", answer.end
    assert answer.end["timing"]["worker"] == "w3@metrics", answer.end


def test_a_worker_serving_a_version_names_it_in_every_series_and_in_its_heartbeat(fleet):
    proc = fleet.start_worker("v7@metrics", BRIGADE_MODEL_VERSION="v7")
    try:
        status = fleet.wait_ready(["v7@metrics"])["v7@metrics"]
        assert (status["model"], status["version"]) == (MODEL, "v7"), status
        families = metric_families(status["metrics_url"], created=False)
        assert {n for n in families if n.startswith("brigade_")} == HISTOGRAMS | GAUGES | COUNTERS
        samples = [s for f in families.values() for s in f.samples]
        # vLLM's names of the same series label the model as vLLM does (`model_name`: workers/vllm_metrics.py).
        assert samples and all((s.labels.get("model", s.labels.get("model_name")), s.labels["version"]) == (MODEL, "v7")
                               for s in samples)
        assert any(s.labels.get("model_name") == MODEL for s in samples)
        # The series a dashboard rates are there from the start, under the version's labels.
        reasons = {s.labels["finished_reason"] for s in families["brigade_request_success"].samples}
        assert reasons == {"stop", "length", "repetition", "cancelled", "error"}
        assert any(s.name == "brigade_time_to_first_token_seconds_count" for s in families[
            "brigade_time_to_first_token_seconds"].samples)
        # The other workers keep their own (unversioned) labels.
        others = fleet.scrape()
        assert others and all(dict(labels)["version"] == "" for snap in others.values() for _, labels in snap)
    finally:
        fleet.kill(proc, signal.SIGTERM, timeout=30)
