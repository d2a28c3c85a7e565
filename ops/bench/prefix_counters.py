"""The fleet's prefix-cache counters, as its workers count them: every live worker's heartbeat in
Redis names its /metrics (metrics_url), where `vllm:prefix_cache_queries_total` counts the prompt
tokens looked up and `vllm:prefix_cache_hits_total` those found (workers/vllm_metrics.py). A run's
hit ratio is the difference of the sums between a reading before it and one after, so that earlier
traffic does not count.
"""
from __future__ import annotations

import urllib.request
from dataclasses import dataclass, field

import redis
from prometheus_client.parser import text_string_to_metric_families

from ops.core import redis_clients
from ops.core.roster import live_workers
from ops.core.redaction import redact_url

HITS = "vllm:prefix_cache_hits_total"
QUERIES = "vllm:prefix_cache_queries_total"
SCRAPE_TIMEOUT_S = 5.0


@dataclass
class PrefixCounters:
    """One reading: (hits, queries) per worker, by its metrics_url (a restarted worker is a new one:
    its counters start again at 0 on a port of its own), and why none could be read, if so."""

    by_worker: dict[str, tuple[float, float]] = field(default_factory=dict)
    unreadable: list[str] = field(default_factory=list)  # metrics_urls that did not answer
    reason: str | None = None  # set when no worker's counters could be read


def read_prefix_counters(redis_url: str) -> PrefixCounters:
    """Every live worker's counters now."""
    try:
        client = redis_clients.client(redis_url, timeout_s=2, connect_timeout_s=2)
        try:
            statuses = live_workers(client)
        finally:
            client.close()
    except (redis.RedisError, OSError, ValueError) as exc:
        return PrefixCounters(reason=f"the workers' Redis {redact_url(redis_url)} does not answer: {exc}")
    urls = sorted({s["metrics_url"] for s in statuses if s.get("metrics_url")})
    if not urls:
        return PrefixCounters(reason=f"no live worker in {redact_url(redis_url)} publishes a metrics_url"
                                     if statuses else f"no live worker in {redact_url(redis_url)}")
    reading = PrefixCounters()
    for url in urls:
        try:
            reading.by_worker[url] = _scrape(url)
        except (OSError, ValueError, KeyError):
            reading.unreadable.append(url)
    if not reading.by_worker:
        reading.reason = f"no worker's metrics could be read ({', '.join(urls)})"
    return reading


def _scrape(url: str) -> tuple[float, float]:
    """(hits, queries) of one worker's /metrics, summed over its series (a worker may serve several
    labels); KeyError when it has no prefix-cache series at all."""
    with urllib.request.urlopen(url, timeout=SCRAPE_TIMEOUT_S) as resp:
        text = resp.read().decode()
    sums = {HITS: 0.0, QUERIES: 0.0}
    seen = set()
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name in sums:
                sums[sample.name] += sample.value
                seen.add(sample.name)
    if seen != set(sums):
        raise KeyError(f"{url} has no {' or '.join(sorted(set(sums) - seen))}")
    return sums[HITS], sums[QUERIES]


def prefix_cache_delta(before: PrefixCounters, after: PrefixCounters) -> dict:
    """The run's prefix-cache tokens: hits, queries and hit_ratio over the workers read at the end
    (a worker not read before started during the run, so all its counts are the run's). Null
    numbers with a `reason` when nothing could be read."""
    reason = after.reason or before.reason
    if reason is not None:
        return {"hits": None, "queries": None, "hit_ratio": None, "workers": 0, "reason": reason}
    hits = queries = 0.0
    counted = 0
    for url, (h, q) in after.by_worker.items():
        if url in before.unreadable:  # what it had counted before the run is unknown
            continue
        h0, q0 = before.by_worker.get(url, (0.0, 0.0))
        if h < h0 or q < q0:  # counters went back: the same address, a new process
            h0 = q0 = 0.0
        hits, queries, counted = hits + h - h0, queries + q - q0, counted + 1
    out = {"hits": int(hits), "queries": int(queries),
           "hit_ratio": round(hits / queries, 4) if queries else None, "workers": counted}
    if not queries:
        out["reason"] = "no prompt token was looked up in any worker's prefix cache during the run"
    unread = sorted(set(before.unreadable) | set(after.unreadable) | (set(before.by_worker) - set(after.by_worker)))
    if unread:
        out["unread_workers"] = unread  # their counts, if any, are missing from the sums
    return out
