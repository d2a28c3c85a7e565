"""Many models and versions on real processes: routing by name, sticky routes, shadows, per-version
caches and metrics, and canaries that step themselves up or roll themselves back.

One redis-server, two gateways, and workers started with `brigade worker --model NAME@VERSION`:
the real default model registered three times (v1 and v3 in the exact default, v2 with the same
answers from ordinary float32 products, which decode markedly slower), and the tiny random model under its own
name. Requests go over real WebSockets and the official `openai` client's HTTP.
"""
from __future__ import annotations

import asyncio
import json
import re
import subprocess
import sys
import urllib.request
from pathlib import Path

import openai
import pytest

from ops.core import redis_keys
from ops.rollout import outcomes, registry
from tests.clients import Answer, ask
from tests.services import Stack, http_get, wait_until

ROOT = Path(__file__).resolve().parent.parent
MODEL = "smollm2"
# The version that must break `tpot_p50<=1.2x`, served from the same weights with the same answers:
# float32 through ordinary products instead of from the weights' grid reads 4-5x the bytes per
# step (engine/grid_linear.py), so one stream decodes several times slower on every CPU kind.
SLOW_ENV = {"BRIGADE_GRID_WEIGHTS": "false"}


class Models(Stack):
    def start_model_worker(self, name: str, ref: str, **env: str | None):
        self.workers[name] = self.start("worker", name, ["--name", name, "--model", ref], **env)
        return self.workers[name]


def brigade(stack: Stack, *args: str, check: bool = True) -> subprocess.CompletedProcess:
    proc = subprocess.run([sys.executable, "-m", "ops.commands.cli", *args], env=stack.env, cwd=ROOT, capture_output=True,
                          text=True, timeout=60)
    if check and proc.returncode != 0:
        raise AssertionError(f"brigade {' '.join(args)} exited {proc.returncode}:\n{proc.stdout}\n{proc.stderr}")
    return proc


def register(client, folder: Path, name: str, version: str) -> None:
    registry.register(client, registry.describe_folder(folder, name, version, str(folder), {}))


@pytest.fixture(scope="module")
def models(redis_server, model_dir, tiny_model_dir, tmp_path_factory):
    store = tmp_path_factory.mktemp("store")
    with Models(redis_server, tmp_path_factory.mktemp("models"), BRIGADE_MODEL_STORE=str(store),
                BRIGADE_TORCH_THREADS="1", BRIGADE_CANARY_TICK_S="0.5") as stack:
        client = redis_server.client
        for version in ("v1", "v2", "v3"):
            register(client, model_dir, MODEL, version)
        register(client, tiny_model_dir, "tiny", "v1")
        register(client, tiny_model_dir, "ghost", "v1")  # registered, never served
        stack.start_gateway()
        stack.start_gateway("second")
        stack.start_model_worker("v1@models", f"{MODEL}@v1")
        stack.start_model_worker("v2@models", f"{MODEL}@v2", **SLOW_ENV)
        stack.start_model_worker("v3@models", f"{MODEL}@v3")
        stack.start_model_worker("tiny@models", "tiny")
        stack.wait_ready()
        yield stack


def run(coro):
    return asyncio.run(coro)


def ws_url(stack: Stack, gateway: str = "gateway") -> str:
    return f"ws://127.0.0.1:{stack.gateways[gateway].port}/v1/ws"


async def ask_many(url: str, requests: list[dict]) -> list[Answer]:
    return await asyncio.gather(*(ask(url, f"r{i}", **fields) for i, fields in enumerate(requests)))


def metric(port: int, name: str, **labels: str) -> float:
    """One series' value from a gateway's /metrics (0 when absent)."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
        text = resp.read().decode()
    want = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
    for line in text.splitlines():
        if line.startswith(name + "{"):
            series, value = line.rsplit(" ", 1)
            got = ",".join(sorted(series[len(name) + 1:-1].split(",")))
            if got == want:
                return float(value)
    return 0.0


def set_route(stack: Stack, *shares: str, sticky: str = "key") -> None:
    brigade(stack, "route", "set", MODEL, *shares, "--sticky", sticky, "--redis-url", stack.redis.url)


def registry_seen(stack: Stack, gateways=("gateway", "second")) -> bool:
    """Every gateway holds the registry's current revision (its /readyz says which it holds)."""
    revision = int(stack.redis.client.get(redis_keys.REGISTRY_REVISION) or 0)
    return all(http_get(stack.gateways[g].port, "/readyz")[1].get("registry_revision") == revision for g in gateways)


def route_seen(stack: Stack, gateway: str, version: str) -> bool:
    answer = run(ask(ws_url(stack, gateway), "probe", prompt="Say hi.", max_tokens=1, cache="off"))
    return answer.end["type"] == "done" and answer.end.get("version") == version


# ---- by name ------------------------------------------------------------------------------------


def test_requests_go_to_the_model_they_name(models):
    tiny = run(ask(models.url, "t", prompt="Hello", max_tokens=4, model="tiny", cache="off"))
    real = run(ask(models.url, "s", messages=[{"role": "user", "content": "What is the capital of France?"}],
                   max_tokens=8, model=MODEL, cache="off"))
    assert tiny.end["type"] == "done" and (tiny.end["model"], tiny.end["version"]) == ("tiny", "v1")
    # Without a route, a model's requests go to its stable version: the first registered.
    assert real.end["type"] == "done" and (real.end["model"], real.end["version"]) == (MODEL, "v1")
    assert "Paris" in real.text


def test_an_unknown_model_is_model_not_found_and_a_model_without_workers_is_503_for_itself_only(models):
    answer = run(ask(models.url, "u", prompt="Hello", max_tokens=2, model="no-such-model"))
    assert answer.end["type"] == "error" and answer.end["code"] == "model_not_found"
    client = openai.OpenAI(base_url=f"{models.http}/v1", api_key="unused", max_retries=0)
    with pytest.raises(openai.NotFoundError) as err:
        client.completions.create(model="no-such-model", prompt="Hello", max_tokens=2)
    assert err.value.body["code"] == "model_not_found"
    with pytest.raises(openai.APIStatusError) as err:
        client.completions.create(model="ghost", prompt="Hello", max_tokens=2)
    assert err.value.status_code == 503 and err.value.body["code"] == "no_workers" and "ghost" in err.value.message
    served = client.completions.create(model="tiny", prompt="Hello", max_tokens=2)
    assert served.choices[0].finish_reason in ("stop", "length")
    raw = client.completions.with_raw_response.create(model=f"{MODEL}@v3", prompt="Hello", max_tokens=2)
    assert raw.headers["x-brigade-model-version"] == "v3"


def test_models_lists_every_model_with_a_live_worker_and_its_versions(models):
    status, body = http_get(models.port, "/v1/models")
    assert status == 200
    cards = {card["id"]: card for card in body["data"] if card["kind"] == "generate"}  # not the cache's models
    assert set(cards) == {MODEL, "tiny"}  # ghost has no worker
    versions = {v["version"]: v for v in cards[MODEL]["versions"]}
    assert set(versions) == {"v1", "v2", "v3"} and all(v["live"] for v in versions.values())
    assert cards[MODEL]["stable"] == "v1" and cards[MODEL]["max_model_len"] == 8192
    assert versions["v1"]["checksum"] == registry.weights_checksum(Path(registry.read_snapshot(
        models.redis.client).entries[f"{MODEL}@v1"].path))


def test_the_answer_cache_is_kept_per_version(models):
    question = {"prompt": "Name a primary colour.", "max_tokens": 6}
    first = run(ask(models.url, "a", model=f"{MODEL}@v1", **question))
    again = run(ask(models.url, "b", model=f"{MODEL}@v1", **question))
    other = run(ask(models.url, "c", model=f"{MODEL}@v3", **question))
    assert first.end.get("cached") is None and again.end.get("cached") == "exact"
    assert other.end["type"] == "done" and other.end.get("cached") is None and other.end["version"] == "v3"


def test_per_version_counters_count_exactly(models):
    port = models.port
    labels = {"model": MODEL, "door": "ws", "outcome": "queued"}
    before = {v: metric(port, "brigade_gateway_requests_total", version=v, **labels) for v in ("v1", "v3")}
    run(ask_many(models.url, [{"prompt": f"Count to {i}.", "max_tokens": 2, "cache": "off", "model": f"{MODEL}@v1"}
                              for i in range(3)]
                 + [{"prompt": f"Count to {i}.", "max_tokens": 2, "cache": "off", "model": f"{MODEL}@v3"}
                    for i in range(2)]))
    after = {v: metric(port, "brigade_gateway_requests_total", version=v, **labels) for v in ("v1", "v3")}
    assert (after["v1"] - before["v1"], after["v3"] - before["v3"]) == (3, 2)


# ---- routes and shadows -------------------------------------------------------------------------


def test_a_sticky_route_keeps_each_user_on_one_version(models):
    set_route(models, "v1=50", "v3=50", sticky="user")
    try:
        wait_until(lambda: registry_seen(models), 10, what="the gateways to load the route")
        users = [f"user-{i}" for i in range(16)]
        requests = [{"prompt": f"Say {word}.", "max_tokens": 1, "cache": "off", "user": user}
                    for user in users for word in ("yes", "no")]
        answers = run(ask_many(models.url, requests))
        by_user: dict[str, set[str]] = {}
        for fields, answer in zip(requests, answers):
            assert answer.end["type"] == "done", answer.end
            by_user.setdefault(fields["user"], set()).add(answer.end["version"])
        assert all(len(v) == 1 for v in by_user.values()), by_user
        assert {v for vs in by_user.values() for v in vs} == {"v1", "v3"}
        expected = {u: registry.pick(registry.read_snapshot(models.redis.client).routes[MODEL].shares,
                                     registry.bucket(MODEL, u)) for u in users}
        assert {u: next(iter(v)) for u, v in by_user.items()} == expected
    finally:
        brigade(models, "route", "clear", MODEL, "--redis-url", models.redis.url)


def test_a_route_change_reaches_both_running_gateways(models):
    """Without a restart: how soon is a figure for a benchmark, not this test."""
    try:
        set_route(models, "v1=0", "v3=100")
        wait_until(lambda: registry_seen(models), 30, interval=0.05, what="both gateways to load the route")
        assert route_seen(models, "gateway", "v3") and route_seen(models, "second", "v3")
        set_route(models, "v1=100", "v3=0")
        wait_until(lambda: registry_seen(models), 30, interval=0.05, what="both gateways to load the route")
        assert route_seen(models, "gateway", "v1") and route_seen(models, "second", "v1")
    finally:
        brigade(models, "route", "clear", MODEL, "--redis-url", models.redis.url)


def test_shadow_copies_are_measured_and_never_delivered(models):
    client = models.redis.client
    stream = redis_keys.outcomes(MODEL, "v3")
    before = len([o for o in outcomes.window(client, MODEL, "v3", 0) if o.shadow])
    counted_before = sum(metric(models.port, "brigade_shadow_requests_total", model=MODEL, version="v3", outcome=o)
                         for o in ("same", "different"))
    brigade(models, "route", "shadow", MODEL, "v3=100", "--redis-url", models.redis.url)
    try:
        wait_until(lambda: registry_seen(models), 10, what="the gateways to load the shadow route")
        answers = run(ask_many(models.url, [{"prompt": f"Tell me a fact about the number {i}.", "max_tokens": 8,
                                             "cache": "off"} for i in range(3)]))
        assert all(a.end["type"] == "done" and a.end["version"] == "v1" for a in answers)
        # Exactly one answer each: a shadow's tokens never reach the client (ask() would have
        # filed them under the same id, and the indexes would repeat).
        assert all(a.indexes == list(range(len(a.indexes))) for a in answers)
        wait_until(lambda: len([o for o in outcomes.window(client, MODEL, "v3", 0) if o.shadow]) >= before + 3, 60,
                   what="three shadow outcomes on v3")
        shadows = [o for o in outcomes.window(client, MODEL, "v3", 0) if o.shadow][before:]
        assert all(o.same_text is not None and o.e2e_s is not None and not o.error for o in shadows)
        counted = sum(metric(models.port, "brigade_shadow_requests_total", model=MODEL, version="v3", outcome=o)
                      for o in ("same", "different"))
        assert counted - counted_before == 3
        assert client.xlen(stream) > 0
    finally:
        brigade(models, "route", "clear", MODEL, "--redis-url", models.redis.url)


def test_batch_lines_route_like_interactive_requests(models):
    client = openai.OpenAI(base_url=f"{models.http}/v1", api_key="unused", max_retries=0)
    wanted = [("tiny", "tiny", "v1"), (f"{MODEL}@v3", MODEL, "v3"), (MODEL, MODEL, "v1")]  # v1: the stable
    lines = [{"custom_id": f"line-{i}", "method": "POST", "url": "/v1/chat/completions",
              "body": {"model": ref, "max_tokens": 4, "temperature": 0,
                       "messages": [{"role": "user", "content": f"Say a word ({i})."}]}}
             for i, (ref, _, _) in enumerate(wanted)]
    source = models.logs / "routed-batch.jsonl"
    source.write_text("".join(json.dumps(x) + "\n" for x in lines))
    batch = client.batches.create(input_file_id=client.files.create(file=source.open("rb"), purpose="batch").id,
                                  endpoint="/v1/chat/completions", completion_window="24h")
    wait_until(lambda: client.batches.retrieve(batch.id).status in ("completed", "failed", "cancelled"), 120,
               interval=0.5, what="the batch job to end")
    batch = client.batches.retrieve(batch.id)
    out = {x["custom_id"]: x["response"] for x in
           map(json.loads, client.files.content(batch.output_file_id).text.splitlines())}
    assert batch.status == "completed" and set(out) == {x["custom_id"] for x in lines}
    for i, (_, model, version) in enumerate(wanted):
        body = out[f"line-{i}"]["body"]
        assert out[f"line-{i}"]["status_code"] == 200 and (body["model"], body["brigade"]["model_version"]) == (
            model, version), body


# ---- canaries -----------------------------------------------------------------------------------


async def keep_asking(url: str, until, tag: str, at_once: int = 1) -> list[Answer]:
    """Distinct users, `at_once` at a time, until `until()` holds (or 200 requests): every answer.
    One at a time by default: each version then decodes one stream, as the slow version's measured
    ratio assumes (deterministic mode costs least at several streams)."""
    answers, i = [], 0
    while not until() and i < 200:
        batch = [ask(url, f"{tag}{i + j}", prompt=f"Write one sentence about topic {i + j}.", max_tokens=12,
                     cache="off", user=f"{tag}-user-{i + j}") for j in range(at_once)]
        answers += await asyncio.gather(*batch)
        i += at_once
    return answers


def canary_state(client, model: str) -> dict:
    raw = client.get(redis_keys.canary(model))
    return json.loads(raw) if raw else {}


def test_a_canary_that_breaks_its_objective_is_rolled_back_and_every_request_is_answered(models):
    client = models.redis.client
    brigade(models, "canary", "start", MODEL, "--version", "v2", "--steps", "50,100", "--interval", "10m",
            "--slo", "tpot_p50<=1.2x,error_rate<=0.01", "--min-requests", "6", "--window", "10m",
            "--redis-url", models.redis.url)
    answers = run(keep_asking(models.url, lambda: canary_state(client, MODEL).get("state") != "running", "rb"))
    printed = brigade(models, "canary", "status", MODEL, "--redis-url", models.redis.url).stdout
    print(printed)
    state = canary_state(client, MODEL)
    assert state["state"] == "rolled_back", state
    assert re.fullmatch(r"rolled back: tpot_p50 \d+(\.\d+)?x stable over \d+ requests", state["reason"]), state["reason"]
    assert all(a.end is not None and a.end["type"] == "done" for a in answers), [a.end for a in answers]
    assert {a.end["version"] for a in answers} == {"v1", "v2"}
    route = registry.read_snapshot(client).routes[MODEL]
    assert route.share_of("v2") == 0 and route.share_of("v1") == 100
    assert "rolled_back" in printed.replace(" ", "_") or "rolled back" in printed
    assert "v1" in printed and "v2" in printed


def test_a_canary_that_holds_its_objectives_is_promoted(models):
    client = models.redis.client
    brigade(models, "canary", "start", MODEL, "--version", "v3", "--steps", "50,100", "--interval", "4s",
            "--slo", "tpot_p50<=3x,error_rate<=0.01", "--min-requests", "4", "--window", "60s",
            "--redis-url", models.redis.url)
    answers = run(keep_asking(models.url, lambda: canary_state(client, MODEL).get("state") != "running", "pr",
                              at_once=4))
    state = canary_state(client, MODEL)
    assert state["state"] == "promoted", state
    assert all(a.end is not None and a.end["type"] == "done" for a in answers)
    snapshot = registry.read_snapshot(client)
    assert snapshot.stable[MODEL] == "v3" and snapshot.routes[MODEL].share_of("v3") == 100
    wait_until(lambda: route_seen(models, "gateway", "v3"), 10, what="the promoted version to take the traffic")
    printed = brigade(models, "canary", "status", MODEL, "--redis-url", models.redis.url).stdout
    print(printed)
    assert "promoted" in printed
