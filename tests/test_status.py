"""`brigade status` against a real redis-server holding a worker's heartbeat, queued work and dead letters."""
from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

from ops.core import redis_keys, roster
from tests.services import free_port

ROOT = Path(__file__).resolve().parent.parent


def status(url: str, *extra: str) -> subprocess.CompletedProcess:
    env = {"BRIGADE_REDIS_URL": url, "PATH": "/usr/bin:/bin", "BRIGADE_MAX_BATCH": "16"}
    return subprocess.run([sys.executable, "-m", "ops.commands.cli", "status", *extra], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=60)


MODEL = "smollm2-135m-instruct"


def beat(r, instance: str, status_: dict) -> None:
    pipe = r.pipeline()
    roster.record_beat(pipe, instance, status_, 30_000, time.time())
    pipe.execute()


def test_status_shows_workers_queue_lanes_cache_and_dead_letters(redis_server):
    r = redis_server.client
    first = {"worker": "w1@status", "pid": 7, "model": MODEL, "version": "", "running": 3, "waiting": 2,
             "kv_used_tokens": 8192, "kv_budget_tokens": 32768, "tokens_per_s": 41.5, "requests_served": 12,
             "draining": True, "metrics_url": "http://127.0.0.1:9321/metrics", "updated_at": time.time()}
    beat(r, "w1@status#abc", first)
    beat(r, "w2@status#def", dict(first, worker="w2@status", pid=8, running=16, waiting=4, draining=False))
    lists = redis_keys.queue_lists(MODEL)
    r.rpush(lists[0], "a")  # priority 0: continued requests
    r.rpush(lists[2], "b", "c")  # priority 6: new requests
    r.rpush(redis_keys.DEAD_LETTERS, json.dumps({"request_id": "x"}))
    r.hset(redis_keys.CACHE_STATS, mapping={"exact_hits": 3, "semantic_hits": 1, "misses": 4})
    r.zadd(redis_keys.CACHE_LRU, {"e1": 1, "e2": 2})
    try:
        out = status(redis_server.url, "--json")
        assert out.returncode == 0, out.stderr
        report = json.loads(out.stdout)
        w, w2 = report["workers"]
        assert (w["worker"], w["state"], w["running"], w["waiting"], w["kv_use"]) == ("w1@status", "draining", 3, 2, 0.25)
        assert (w["model"], w["version"]) == (MODEL, "")
        assert w["metrics_url"] == "http://127.0.0.1:9321/metrics"
        assert report["queue"]["total"] == 3 and report["queue"]["by_priority"]["continued"] == 1
        assert report["queue"]["by_priority"]["new"] == 2
        [served] = report["models"]  # one model, unversioned: one section
        assert (served["served"], served["alive"], served["draining"], served["running"], served["waiting"]) == \
            (MODEL, 2, 1, 19, 6)
        assert served["queue"] == report["queue"] and [x["worker"] for x in served["workers"]] == ["w1@status", "w2@status"]
        assert report["cache"] == {"entries": 2, "hit_rate": 0.5, "hits": 4, "lookups": 8}
        assert report["dead_letters"] == 1
        # ⌈(3 queued + 19 running + 6 waiting) / 16 per worker⌉ = 2, and the draining one does not count.
        a = report["autoscale"]
        assert (a["desired"], a["workers"], a["in_system"], a["per_worker"]) == (2, 1, 28, 16), a
        assert served["desired"] == 2
        screen = status(redis_server.url).stdout
        assert "w1@status" in screen and "draining" in screen and "25%" in screen and "3 waiting" in screen
        assert f"{MODEL} (unversioned): 2 worker(s), 1 draining, 19 running" in screen
        assert "hit rate 50.0% of 8 lookups" in screen and "dead letters: 1" in screen
        assert "autoscale: 2 worker(s) wanted, 1 serving" in screen
    finally:
        r.flushdb()


def test_status_groups_workers_and_queues_by_model_version(redis_server):
    from ops.rollout import registry

    r = redis_server.client
    now = time.time()
    common = {"pid": 7, "model": MODEL, "waiting": 0, "kv_used_tokens": 0, "kv_budget_tokens": 32768,
              "tokens_per_s": 1.0, "requests_served": 1, "draining": False, "metrics_url": None, "updated_at": now}
    beat(r, "a#1", dict(common, worker="v1-a@status", version="v1", running=2))
    beat(r, "b#1", dict(common, worker="v1-b@status", version="v1", running=3))
    beat(r, "c#1", dict(common, worker="v2-a@status", version="v2", running=1, waiting=1))
    r.rpush(redis_keys.queue_lists(MODEL, "v1")[2], "n1", "n2")
    r.rpush(redis_keys.queue_lists(MODEL, "v2")[0], "c1")
    r.rpush(redis_keys.queue_lists(MODEL, "v2")[3], "b1", "b2", "b3")  # batch lines
    r.rpush(redis_keys.queue_lists(MODEL)[2], "stray")  # the unversioned queue, no worker: shown too
    for version in ("v1", "v2", "v3"):  # v3: registered, no worker, nothing queued
        registry.register(r, registry.ModelEntry(name=MODEL, version=version, source="/nowhere", path="/nowhere",
                                                 checksum="0" * 64, parameters=1, added_at=now))
    try:
        out = status(redis_server.url, "--json")
        assert out.returncode == 0, out.stderr
        report = json.loads(out.stdout)
        by = {m["served"]: m for m in report["models"]}
        assert list(by) == [MODEL, f"{MODEL}@v1", f"{MODEL}@v2", f"{MODEL}@v3"], list(by)
        v1, v2, v3, bare = by[f"{MODEL}@v1"], by[f"{MODEL}@v2"], by[f"{MODEL}@v3"], by[MODEL]
        assert [w["worker"] for w in v1["workers"]] == ["v1-a@status", "v1-b@status"]
        assert (v1["alive"], v1["running"], v1["waiting"], v1["queue"]["total"], v1["queue"]["by_priority"]["new"]) == \
            (2, 5, 0, 2, 2)
        assert (v2["alive"], v2["running"], v2["waiting"], v2["queue"]["total"]) == (1, 1, 1, 4)
        assert v2["queue"]["by_priority"] == {"continued": 1, "priority 3": 0, "new": 0, "batch": 3}
        # Each version's workers serve only its queue: each is scaled on its own numbers.
        assert (v1["desired"], v2["desired"]) == (1, 1)
        assert (v3["alive"], v3["queue"]["total"], v3["registered"], v3["workers"]) == (0, 0, True, [])
        assert (bare["alive"], bare["queue"]["total"], bare["registered"]) == (0, 1, False)
        assert report["queue"]["total"] == 7 and len(report["workers"]) == 3
        assert {w["worker"]: w["version"] for w in report["workers"]} == \
            {"v1-a@status": "v1", "v1-b@status": "v1", "v2-a@status": "v2"}
        screen = status(redis_server.url).stdout
        sections = [line for line in screen.splitlines() if line.startswith(MODEL)]
        assert sections == [
            f"{MODEL} (unversioned): no live worker, 1 worker(s) wanted",
            f"{MODEL}@v1: 2 worker(s), 5 running, 0 waiting in engines, 1 worker(s) wanted",
            f"{MODEL}@v2: 1 worker(s), 1 running, 1 waiting in engines, 1 worker(s) wanted",
            f"{MODEL}@v3: no live worker",
        ], screen
        assert "workers: 3 alive over 4 model version(s)" in screen
        assert "  queue interactive: 4 waiting (continued 1, batch 3)" in screen
    finally:
        r.flushdb()


def test_status_without_redis_says_so_in_one_line():
    out = status(f"redis://127.0.0.1:{free_port()}/0")
    assert out.returncode == 1 and "does not answer" in out.stderr and "Traceback" not in out.stderr
