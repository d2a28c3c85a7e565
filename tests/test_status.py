"""`brigade status` against a real redis-server holding a worker's heartbeat, queued work and dead letters."""
from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

from ops.core import fleet, keys
from tests.services import free_port

ROOT = Path(__file__).resolve().parent.parent


def status(url: str, *extra: str) -> subprocess.CompletedProcess:
    env = {"BRIGADE_REDIS_URL": url, "PATH": "/usr/bin:/bin", "BRIGADE_MAX_BATCH": "16"}
    return subprocess.run([sys.executable, "-m", "ops.cli", "status", *extra], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=60)


def test_status_shows_workers_queue_lanes_cache_and_dead_letters(redis_server):
    r = redis_server.client
    beat = {"worker": "w1@status", "pid": 7, "model": "smollm2-135m-instruct", "running": 3, "waiting": 2,
            "kv_used_tokens": 8192, "kv_budget_tokens": 32768, "tokens_per_s": 41.5, "requests_served": 12,
            "draining": True, "metrics_url": "http://127.0.0.1:9321/metrics", "updated_at": time.time()}
    other = dict(beat, worker="w2@status", pid=8, running=16, waiting=4, draining=False)
    for instance, status_ in (("w1@status#abc", beat), ("w2@status#def", other)):
        pipe = r.pipeline()
        fleet.record_beat(pipe, instance, status_, 30_000, time.time())
        pipe.execute()
    lists = keys.queue_lists("smollm2-135m-instruct")
    r.rpush(lists[0], "a")  # priority 0: continued requests
    r.rpush(lists[2], "b", "c")  # priority 6: new requests
    r.rpush(keys.DEAD_LETTERS, json.dumps({"request_id": "x"}))
    r.hset(keys.CACHE_STATS, mapping={"exact_hits": 3, "semantic_hits": 1, "misses": 4})
    r.zadd(keys.CACHE_LRU, {"e1": 1, "e2": 2})
    try:
        out = status(redis_server.url, "--json")
        assert out.returncode == 0, out.stderr
        report = json.loads(out.stdout)
        w, w2 = report["workers"]
        assert (w["worker"], w["state"], w["running"], w["waiting"], w["kv_use"]) == ("w1@status", "draining", 3, 2, 0.25)
        assert w["metrics_url"] == "http://127.0.0.1:9321/metrics"
        assert report["queue"]["total"] == 3 and report["queue"]["by_priority"]["continued"] == 1
        assert report["queue"]["by_priority"]["new"] == 2
        assert report["cache"] == {"entries": 2, "hit_rate": 0.5, "hits": 4, "lookups": 8}
        assert report["dead_letters"] == 1
        # ⌈(3 queued + 19 running + 6 waiting) / 16 per worker⌉ = 2, and the draining one does not count.
        a = report["autoscale"]
        assert (a["desired"], a["workers"], a["in_system"], a["per_worker"]) == (2, 1, 28, 16), a
        screen = status(redis_server.url).stdout
        assert "w1@status" in screen and "draining" in screen and "25%" in screen and "3 waiting" in screen
        assert "hit rate 50.0% of 8 lookups" in screen and "dead letters: 1" in screen
        assert "autoscale: 2 worker(s) wanted, 1 serving" in screen
    finally:
        r.flushdb()


def test_status_without_redis_says_so_in_one_line():
    out = status(f"redis://127.0.0.1:{free_port()}/0")
    assert out.returncode == 1 and "does not answer" in out.stderr and "Traceback" not in out.stderr
