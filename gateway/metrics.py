"""The gateway's Prometheus metrics, served at GET /metrics (docs/metrics.md).

What only a gateway sees: requests by door and outcome, cache lookups and hits by layer,
refusals (overload, no worker, rate limits, content guards), and, read from Redis once a second
by the load monitor, the fleet's state: workers alive, queue depth per lane, dead letters and
cache entries. Latency histograms, tokens and KV use come from each worker's own /metrics.
One registry of its own (not prometheus_client's global one), with the model and version as labels.
"""
from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest

REGISTRY = CollectorRegistry(auto_describe=True)

REQUESTS = Counter("brigade_gateway_requests_total", "Requests admitted or refused, by door and outcome "
                   "(queued, cached, refused)", ["model", "version", "door", "outcome"], registry=REGISTRY)
ROUTING_DECISIONS = Counter("brigade_routing_decisions_total", "Where requests were queued (docs/scaling.md): "
                            "prefix_hit (the worker holding the prompt's start), load_fallback (the least "
                            "loaded), miss (no worker holds it: the shared queue), shared (routing off, a batch "
                            "line or one worker), unknown (the prompt could not be tokenized)",
                            ["model", "version", "decision"], registry=REGISTRY)
ROUTING_SECONDS = Histogram("brigade_routing_decision_seconds", "Time to choose a request's queue (tokenize, chain "
                            "block keys, look up the prefix index, weigh loads), for decisions that looked",
                            ["model", "version"], buckets=(0.0002, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05),
                            registry=REGISTRY)
CACHE_LOOKUPS = Counter("brigade_cache_lookups_total", "Answer-cache lookups", ["model", "version"], registry=REGISTRY)
CACHE_HITS = Counter("brigade_cache_hits_total", "Answer-cache hits, by layer (exact, semantic)",
                     ["model", "version", "layer"], registry=REGISTRY)
CACHE_AUDITS = Counter("brigade_cache_audits_total", "Semantic hits audited, by outcome (agreed: the judge "
                       "found the served answer fits the asked question, different, error, not_queued)",
                       ["model", "outcome"], registry=REGISTRY)
CACHE_ENTRIES = Gauge("brigade_cache_entries", "Entries in the answer cache", ["model"], registry=REGISTRY)
OVERLOAD_REFUSALS = Counter("brigade_overload_refusals_total", "Requests refused for load, by code "
                            "(overloaded, no_workers)", ["model", "version", "code"], registry=REGISTRY)
RATE_LIMIT_REFUSALS = Counter("brigade_rate_limit_refusals_total", "Requests refused by a key's limit, by limit "
                              "(rpm, tpm, max_concurrent)", ["model", "limit"], registry=REGISTRY)
CONTENT_BLOCKED = Counter("brigade_content_blocked_total", "Requests ended by a content guard, by stage "
                          "(prompt, output)", ["model", "stage"], registry=REGISTRY)
WORKERS_ALIVE = Gauge("brigade_workers_alive", "Workers whose heartbeat is current", registry=REGISTRY)
QUEUE_DEPTH = Gauge("brigade_queue_depth", "Requests waiting on the queue for a worker, by lane",
                    ["model", "version", "lane"], registry=REGISTRY)
SHADOW_REQUESTS = Counter("brigade_shadow_requests_total", "Shadow copies measured, by outcome (same: its text "
                          "equals the served answer, different, error, unknown: the served answer did not finish, "
                          "not_queued)", ["model", "version", "outcome"], registry=REGISTRY)
CANARY_DECISIONS = Counter("brigade_canary_decisions_total", "Canary decisions taken by this gateway's controller "
                           "(stepped, promoted, rolled_back)", ["model", "version", "decision"], registry=REGISTRY)
BATCH_LINES = Counter("brigade_batch_lines_total", "Batch job lines written to their output, by outcome "
                      "(completed, failed: the request's answer was an error, invalid: a skipped bad line)", ["model", "outcome"], registry=REGISTRY)
WORKERS_DESIRED = Gauge("brigade_workers_desired", "Workers that the requests now queued and running call for "
                        "(the autoscaling signal; docs/scaling.md)", ["model"], registry=REGISTRY)
EMBEDDING_REQUESTS = Counter("brigade_embedding_requests_total", "POST /v1/embeddings requests, by outcome (served, "
                             "refused: the caller's error or limit, unavailable, failed)", ["model", "outcome"],
                             registry=REGISTRY)
EMBEDDING_INPUTS = Counter("brigade_embedding_inputs_total", "Texts in /v1/embeddings requests, by the request's "
                           "outcome", ["model", "outcome"], registry=REGISTRY)
EMBEDDING_SECONDS = Histogram("brigade_embedding_request_seconds", "Seconds from a served /v1/embeddings request's "
                              "arrival to its response (key, limits, embedding)", ["model"], registry=REGISTRY)
RERANK_REQUESTS = Counter("brigade_rerank_requests_total", "POST /v1/rerank and /v1/score requests, by model, api "
                          "(rerank, score) and outcome (served, refused: the caller's error or limit, unavailable, "
                          "failed)", ["model", "api", "outcome"], registry=REGISTRY)
RERANK_PAIRS = Counter("brigade_rerank_pairs_total", "Pairs scored or asked for in /v1/rerank (a query and a "
                       "document) and /v1/score requests, by the request's outcome", ["model", "api", "outcome"],
                       registry=REGISTRY)
RERANK_SECONDS = Histogram("brigade_rerank_request_seconds", "Seconds from a served /v1/rerank or /v1/score "
                           "request's arrival to its response (key, limits, scoring)", ["model", "api"],
                           registry=REGISTRY)
DEAD_LETTERS = Gauge("brigade_dead_letter_queue_length", "Requests in the dead-letter list", registry=REGISTRY)


def exposition() -> tuple[bytes, str]:
    return generate_latest(REGISTRY), CONTENT_TYPE_LATEST
