"""`brigade status`: one screen for an operator, read straight from Redis.

A section per served model version (model@version, or the model alone when unversioned): its
workers (alive, draining, running and waiting requests, KV use, tokens/s, metrics address), their
totals, its queue's depth per priority and the workers its load calls for. A version's workers
take only its own queue, so each is read and scaled on its own. Then the answer cache's size and
hit rate, the autoscaling signal of the whole fleet and the dead letters.

The versions shown are those with a live worker, those registered (`brigade models`), and the
configured model (BRIGADE_MODEL_NAME / BRIGADE_MODEL_VERSION) when it has a worker or a queue, or
when nothing else is there to show.
"""
from __future__ import annotations

import json
import sys
import time
from dataclasses import asdict

import redis

from ops.core import redis_clients, redis_keys, roster
from ops.rollout import registry
from ops.core.roster import scale_signal
from ops.core.redaction import redact, redact_url
from ops.core.settings import Settings

# kombu's priority steps as Brigade uses them (ops/core/queue.py): continued requests jump the queue,
# batch lines wait behind all interactive work.
STEP_NAMES = {0: "continued", 3: "priority 3", 6: "new", 9: "batch"}


def _worker_row(w: dict, now: float) -> dict:
    return {
        "worker": w.get("worker"), "pid": w.get("pid"), "model": w.get("model"), "version": w.get("version") or "",
        "state": "draining" if w.get("draining") else "alive",
        "running": w.get("running", 0), "waiting": w.get("waiting", 0),
        "kv_use": round(w["kv_used_tokens"] / w["kv_budget_tokens"], 4) if w.get("kv_budget_tokens") else None,
        "tokens_per_s": w.get("tokens_per_s"), "requests_served": w.get("requests_served"),
        "metrics_url": w.get("metrics_url"), "beat_age_s": round(now - w.get("updated_at", now), 2),
        # What its prefix cache holds, and its share of its version's (routing sends a prompt where
        # its start is held: docs/scaling.md); the share is filled in beside its version's workers.
        "prefix_cached_tokens": w.get("prefix_cached_tokens", 0), "prefix_share": None,
    }


def _prefix_shares(rows: list[dict]) -> list[dict]:
    total = sum(r["prefix_cached_tokens"] for r in rows)
    for r in rows:
        r["prefix_share"] = round(r["prefix_cached_tokens"] / total, 4) if total else None
    return rows


def _queue(depths: list[int]) -> dict:
    return {"lane": "interactive", "total": sum(depths),
            "by_priority": {STEP_NAMES[step]: d for step, d in zip(redis_keys.PRIORITY_STEPS, depths)}}


def _served_versions(r: redis.Redis, settings: Settings, statuses: list[dict]) -> tuple[list[tuple[str, str]], set]:
    """Every (model, version) to show, in order, and the registered ones among them."""
    registered = {(e.name, e.version) for e in registry.read_snapshot(r).entries.values()}
    with_workers = {(str(w.get("model")), w.get("version") or "") for w in statuses}
    configured = (settings.model_name, settings.model_version)
    return sorted(with_workers | registered | {configured}), registered


def collect(settings: Settings) -> dict:
    r = redis_clients.client(settings.redis_url)
    statuses = roster.live_workers(r)
    served, registered = _served_versions(r, settings, statuses)
    pipe = r.pipeline(transaction=False)
    for model, version in served:
        for name in redis_keys.queue_lists(model, version):
            pipe.llen(name)
    replies = pipe.execute()
    steps = len(redis_keys.PRIORITY_STEPS)
    now = time.time()
    models = []
    for i, (model, version) in enumerate(served):
        depths = replies[i * steps:(i + 1) * steps]
        mine = [w for w in statuses if (str(w.get("model")), w.get("version") or "") == (model, version)]
        signal = scale_signal(mine, sum(depths), settings.per_worker_target)
        models.append({
            "served": redis_keys.served(model, version), "model": model, "version": version,
            "registered": (model, version) in registered,
            # alive: live heartbeats, the draining ones among them (as the fleet's line counts them)
            "alive": len(mine), "draining": sum(bool(w.get("draining")) for w in mine),
            "running": signal.running, "waiting": signal.waiting,
            "queue": _queue(depths), "desired": signal.desired,
            "workers": _prefix_shares([_worker_row(w, now) for w in sorted(mine, key=lambda w: str(w.get("worker")))]),
        })
    configured = redis_keys.served(settings.model_name, settings.model_version)
    shown = [m for m in models if m["workers"] or m["queue"]["total"] or m["registered"]]
    models = shown or [m for m in models if m["served"] == configured]
    depths = [sum(m["queue"]["by_priority"][STEP_NAMES[step]] for m in models) for step in redis_keys.PRIORITY_STEPS]
    dead = r.llen(redis_keys.DEAD_LETTERS)
    signal = scale_signal(statuses, sum(depths), settings.per_worker_target)
    c = r if settings.cache_redis == settings.redis_url else redis_clients.client(settings.cache_redis)
    counters = {k: int(v) for k, v in c.hgetall(redis_keys.CACHE_STATS).items()}
    hits = counters.get("exact_hits", 0) + counters.get("semantic_hits", 0)
    lookups = hits + counters.get("misses", 0)
    return {
        "models": models,
        # Every worker, of every version, and every version's queue added up: the fleet at a glance.
        "workers": sorted((_worker_row(w, now) for w in statuses), key=lambda w: str(w["worker"])),
        "queue": _queue(depths),
        "cache": {"entries": c.zcard(redis_keys.CACHE_LRU), "hit_rate": round(hits / lookups, 4) if lookups else None,
                  "hits": hits, "lookups": lookups},
        "dead_letters": dead,
        "autoscale": asdict(signal) | {"desired": signal.desired, "in_system": signal.in_system},
    }


def _table(workers: list[dict]) -> list[str]:
    rows = [["worker", "state", "running", "waiting", "kv use", "prefixes", "tok/s", "served", "metrics"]]
    for w in workers:
        kv = "-" if w["kv_use"] is None else f"{w['kv_use']:.0%}"
        share = "" if w.get("prefix_share") is None else f" ({w['prefix_share']:.0%})"
        prefixes = f"{w.get('prefix_cached_tokens', 0):,} tok{share}"
        rows.append([str(w["worker"]), w["state"], str(w["running"]), str(w["waiting"]), kv, prefixes,
                     str(w["tokens_per_s"]), str(w["requests_served"]), w["metrics_url"] or "-"])
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return ["    " + "  ".join(cell.ljust(n) for cell, n in zip(row, widths)).rstrip() for row in rows]


def _section(m: dict) -> list[str]:
    name = m["served"] + ("" if m["version"] else " (unversioned)")
    if m["workers"]:
        head = f"{m['alive']} worker(s)" + (f", {m['draining']} draining" if m["draining"] else "")
        head += f", {m['running']} running, {m['waiting']} waiting in engines, {m['desired']} worker(s) wanted"
    else:
        head = "no live worker" + (f", {m['desired']} worker(s) wanted" if m["desired"] else "")
    q = m["queue"]
    parts = ", ".join(f"{step} {n}" for step, n in q["by_priority"].items() if n)
    return [f"{name}: {head}", *(_table(m["workers"]) if m["workers"] else []),
            f"  queue {q['lane']}: {q['total']} waiting" + (f" ({parts})" if parts else "")]


def render(report: dict) -> str:
    workers = report["workers"]
    draining = sum(w["state"] == "draining" for w in workers)
    lines = [f"workers: {len(workers)} alive" + (f", {draining} draining" if draining else "")
             + f" over {len(report['models'])} model version(s)"]
    for m in report["models"]:
        lines += _section(m)
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
        print(f"brigade status: Redis at {redact_url(settings.redis_url)} does not answer ({redact(redis_clients.one_line(exc))})", file=sys.stderr)
        return 1
    print(json.dumps(report, indent=2) if as_json else render(report))
    return 0
