"""`brigade status`: one screen for an operator, read straight from Redis.

Workers (alive, draining, running and waiting requests, KV use, tokens/s, metrics address), the
queue depth per lane and priority, the answer cache's size and hit rate, the autoscaling signal
(the workers that what is in the system calls for) and the dead letters.
"""
from __future__ import annotations

import json
import sys
import time
from dataclasses import asdict

import redis

from ops.core import fleet, keys, redis_clients
from ops.core.fleet import scale_signal
from ops.core.redaction import redact, redact_url
from ops.core.settings import Settings

# kombu's priority steps as Brigade uses them (ops/core/queue.py): continued requests jump the queue,
# batch lines wait behind all interactive work.
STEP_NAMES = {0: "continued", 3: "priority 3", 6: "new", 9: "batch"}


def collect(settings: Settings) -> dict:
    r = redis_clients.client(settings.redis_url)
    workers = fleet.live_workers(r)
    lists = keys.queue_lists(settings.model_name)
    depths = [r.llen(name) for name in lists]
    dead = r.llen(keys.DEAD_LETTERS)
    signal = scale_signal(workers, sum(depths), settings.per_worker_target)
    c = r if settings.cache_redis == settings.redis_url else redis_clients.client(settings.cache_redis)
    counters = {k: int(v) for k, v in c.hgetall(keys.CACHE_STATS).items()}
    hits = counters.get("exact_hits", 0) + counters.get("semantic_hits", 0)
    lookups = hits + counters.get("misses", 0)
    now = time.time()
    return {
        "workers": [{
            "worker": w.get("worker"), "pid": w.get("pid"), "model": w.get("model"),
            "state": "draining" if w.get("draining") else "alive",
            "running": w.get("running", 0), "waiting": w.get("waiting", 0),
            "kv_use": round(w["kv_used_tokens"] / w["kv_budget_tokens"], 4) if w.get("kv_budget_tokens") else None,
            "tokens_per_s": w.get("tokens_per_s"), "requests_served": w.get("requests_served"),
            "metrics_url": w.get("metrics_url"), "beat_age_s": round(now - w.get("updated_at", now), 2),
        } for w in sorted(workers, key=lambda w: str(w.get("worker")))],
        "queue": {"lane": "interactive", "model": settings.model_name, "total": sum(depths),
                  "by_priority": {STEP_NAMES[step]: d for step, d in zip(keys.PRIORITY_STEPS, depths)}},
        "cache": {"entries": c.zcard(keys.CACHE_LRU), "hit_rate": round(hits / lookups, 4) if lookups else None,
                  "hits": hits, "lookups": lookups},
        "dead_letters": dead,
        "autoscale": asdict(signal) | {"desired": signal.desired, "in_system": signal.in_system},
    }


def render(report: dict) -> str:
    lines = []
    workers = report["workers"]
    lines.append(f"workers: {len(workers)} alive" + (f", {sum(w['state'] == 'draining' for w in workers)} draining"
                                                      if any(w["state"] == "draining" for w in workers) else ""))
    if workers:
        rows = [["worker", "state", "running", "waiting", "kv use", "tok/s", "served", "metrics"]]
        for w in workers:
            kv = "-" if w["kv_use"] is None else f"{w['kv_use']:.0%}"
            rows.append([str(w["worker"]), w["state"], str(w["running"]), str(w["waiting"]), kv,
                         str(w["tokens_per_s"]), str(w["requests_served"]), w["metrics_url"] or "-"])
        widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
        lines += ["  " + "  ".join(cell.ljust(n) for cell, n in zip(row, widths)).rstrip() for row in rows]
    q = report["queue"]
    parts = ", ".join(f"{name} {n}" for name, n in q["by_priority"].items() if n)
    lines.append(f"queue {q['lane']} ({q['model']}): {q['total']} waiting" + (f" ({parts})" if parts else ""))
    cache = report["cache"]
    rate = "-" if cache["hit_rate"] is None else f"{cache['hit_rate']:.1%} of {cache['lookups']} lookups"
    lines.append(f"cache: {cache['entries']} entries, hit rate {rate}")
    a = report["autoscale"]
    lines.append(f"autoscale: {a['desired']} worker(s) wanted, {a['workers']} serving "
                 f"(⌈queued {a['queued']} + running {a['running']} + waiting {a['waiting']} over {a['per_worker']} "
                 "per worker⌉)")
    lines.append(f"dead letters: {report['dead_letters']}" + ("  (brigade dlq list)" if report["dead_letters"] else ""))
    return "\n".join(lines)


def run(settings: Settings, as_json: bool) -> int:
    try:
        report = collect(settings)
    except redis.RedisError as exc:
        print(f"brigade status: Redis at {redact_url(settings.redis_url)} does not answer ({redact(str(exc))})", file=sys.stderr)
        return 1
    print(json.dumps(report, indent=2) if as_json else render(report))
    return 0
