"""A worker's Prometheus metrics: what its engine did, served on the worker's own /metrics.

Names and meanings follow vLLM's (`vllm:time_to_first_token_seconds` -> `brigade_time_to_first_token_seconds`),
and the worker exposes vLLM's own names too, read from the same collectors (workers/vllm_metrics.py),
every series labelled with the served model's name and registered version (`model`, `version`; the
version is "" for a worker serving an unversioned folder); docs/metrics.md lists them. They live in
this module's REGISTRY, not in prometheus_client's global one, so the worker exposes exactly
these and a gateway in the same process (tests, tools) never mixes its own in.

The worker records each fact once, where it becomes known (`WorkerMetrics`, from engine_loop.py
and serving.py): a token's arrival is one observe or inc, with label children resolved once at
start, so the hot path takes no label lookup and no Redis round trip. The gauges (running,
waiting, KV use) are read from the engine when Prometheus scrapes (`EngineGauges`), so they cost
nothing between scrapes and are never stale.
"""
from __future__ import annotations

import logging
import socket
import threading
from dataclasses import dataclass
from typing import Callable, Iterable

from prometheus_client import CollectorRegistry, Counter, Histogram, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from workers.vllm_metrics import VllmNames

log = logging.getLogger("brigade.worker")

REGISTRY = CollectorRegistry()

# Seconds, roughly log-spaced (about 1.5-2x apart) from 1 ms to 120 s: a GPU's TTFT and inter-token
# gaps sit at the low end, this CPU's prefill of a long prompt and whole answers at the high end.
LATENCY_BUCKETS = (
    0.001, 0.0025, 0.005, 0.0075, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75,
    1.0, 1.5, 2.0, 3.0, 5.0, 7.5, 10.0, 15.0, 20.0, 30.0, 60.0, 120.0,
)
# Sequences in one decode step: powers of two up to the largest max_batch worth configuring.
BATCH_SIZE_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)
SERVED = ["model", "version"]  # every series: the served model and its version ("" when unversioned)


def _latency(name: str, doc: str) -> Histogram:
    return Histogram(name, doc, SERVED, buckets=LATENCY_BUCKETS, registry=REGISTRY)


TIME_TO_FIRST_TOKEN = _latency(
    "brigade_time_to_first_token_seconds",
    "Time from the gateway's enqueue to the request's first token (index 0), observed when it is generated.")
TIME_PER_OUTPUT_TOKEN = _latency(
    "brigade_time_per_output_token_seconds",
    "Per request: (finish - first token here) / (tokens generated here - 1), for requests ended by stop or length.")
INTER_TOKEN_LATENCY = _latency(
    "brigade_inter_token_latency_seconds",
    "Time between two consecutive tokens of one request on this worker, observed per token.")
E2E_REQUEST_LATENCY = _latency(
    "brigade_e2e_request_latency_seconds",
    "Time from the gateway's enqueue to the request's end, for requests ended by stop or length.")
REQUEST_QUEUE_TIME = _latency(
    "brigade_request_queue_time_seconds",
    "Time waiting before the engine admitted the request (broker queue + engine queue), for requests "
    "ended by stop or length; a continued request counts only its wait on this worker's engine.")
REQUEST_PREFILL_TIME = _latency(
    "brigade_request_prefill_time_seconds",
    "Time from the engine's admission to the first token on this worker, for requests ended by stop or length.")
BATCH_SIZE = Histogram(
    "brigade_batch_size", "Decode rows in one engine step.", SERVED, buckets=BATCH_SIZE_BUCKETS,
    registry=REGISTRY)

PROMPT_TOKENS = Counter(
    "brigade_prompt_tokens", "Prompt tokens prefilled by this worker (counted at a request's first token here).",
    SERVED, registry=REGISTRY)
GENERATION_TOKENS = Counter(
    "brigade_generation_tokens", "Tokens this worker generated for the requests it held.", SERVED, registry=REGISTRY)
REQUEST_SUCCESS = Counter(
    "brigade_request_success", "Requests this worker ended with a done event, by finish reason.",
    [*SERVED, "finished_reason"], registry=REGISTRY)
REQUEST_ERRORS = Counter(
    "brigade_request_errors", "Requests this worker ended with an error event, by error code.",
    [*SERVED, "code"], registry=REGISTRY)
LANE_REQUESTS = Counter(
    "brigade_lane_requests", "Requests this worker ended, by lane (interactive, batch). The latency histograms "
    "describe the interactive lane only.", [*SERVED, "lane"], registry=REGISTRY)
LANE_TOKENS = Counter(
    "brigade_lane_generation_tokens", "Tokens this worker generated, by lane (interactive, batch).",
    [*SERVED, "lane"], registry=REGISTRY)
FAILOVERS = Counter(
    "brigade_failovers", "Requests this worker continued after another worker died or handed them back.",
    SERVED, registry=REGISTRY)
DEAD_LETTERS = Counter(
    "brigade_dead_letters", "Requests this worker's claim moved to the dead-letter list.", SERVED, registry=REGISTRY)
STOLEN = Counter(
    "brigade_routing_stolen", "Requests routed to another worker's own queue that this idle worker took after "
    "steal_after_s (workers/stealing.py).", SERVED, registry=REGISTRY)


# Counters read from the engine at scrape time: name, help, its Engine.stats key.
ENGINE_COUNTERS = (
    ("brigade_num_preemptions", "Sequences preempted and recomputed later: batch rows for interactive ones, or the "
     "lowest-priority running sequence when running sequences outgrow the KV memory", "preemptions"),
    ("brigade_prefix_cache_queries", "Prompt tokens looked up in the prefix cache (engine/prefix_cache.py)",
     "prefix_query_tokens"),
    ("brigade_prefix_cache_hits", "Prompt tokens whose KV was found in the prefix cache instead of computed",
     "prefix_hit_tokens"),
)
# The engine gauges, registered once a worker has an engine (EngineGauges): name, help.
ENGINE_GAUGES = (
    ("brigade_num_requests_running", "Requests in the engine's running batch."),
    ("brigade_num_requests_waiting", "Requests in the engine waiting for admission (KV memory or a batch slot)."),
    ("brigade_kv_cache_usage_perc", "KV cache memory held, as a ratio of the budget (1 = full)."),
)


class EngineGauges(Collector):
    """The engine's queue and memory, read at scrape time from `stats` (Engine.stats)."""

    def __init__(self, model: str, version: str, stats: Callable[[], dict]):
        self.served = [model, version]
        self.stats = stats

    def collect(self) -> Iterable[GaugeMetricFamily]:
        s = self.stats()
        budget = s.get("kv_budget_tokens") or 0
        values = (s["running"], s["waiting"], s["kv_used_tokens"] / budget if budget else 0.0)
        for (name, doc), value in zip(ENGINE_GAUGES, values):
            family = GaugeMetricFamily(name, doc, labels=SERVED)
            family.add_metric(self.served, value)
            yield family
        for name, doc, key in ENGINE_COUNTERS:
            counter = CounterMetricFamily(name, doc, labels=SERVED)
            counter.add_metric(self.served, s.get(key, 0))
            yield counter


_engine_gauges: EngineGauges | None = None
_gauges_lock = threading.Lock()


def _own_collectors() -> list[Collector]:
    """The collectors whose families vLLM names too (workers/vllm_metrics.py), read at each scrape."""
    own: list[Collector] = [TIME_TO_FIRST_TOKEN, TIME_PER_OUTPUT_TOKEN, INTER_TOKEN_LATENCY, E2E_REQUEST_LATENCY,
                            REQUEST_QUEUE_TIME, REQUEST_PREFILL_TIME, PROMPT_TOKENS, GENERATION_TOKENS,
                            REQUEST_SUCCESS]
    gauges = _engine_gauges
    return own + ([gauges] if gauges is not None else [])


# vLLM's names beside Brigade's: the same samples, not a second count.
REGISTRY.register(VllmNames(_own_collectors))


class WorkerMetrics:
    """One worker's handles on the metrics above, bound to its model and version labels."""

    FULL_RUN = frozenset({"stop", "length", "repetition"})  # the ends whose latencies describe a whole answer
    REASONS = ("stop", "length", "repetition", "cancelled", "error")

    def __init__(self, model: str, version: str = ""):
        self.model, self.version = model, version
        served = (model, version)
        self.ttft = TIME_TO_FIRST_TOKEN.labels(*served)
        self.tpot = TIME_PER_OUTPUT_TOKEN.labels(*served)
        self.itl = INTER_TOKEN_LATENCY.labels(*served)
        self.e2e = E2E_REQUEST_LATENCY.labels(*served)
        self.queue_time = REQUEST_QUEUE_TIME.labels(*served)
        self.prefill_time = REQUEST_PREFILL_TIME.labels(*served)
        self.batch_size = BATCH_SIZE.labels(*served)
        self.prompt_tokens = PROMPT_TOKENS.labels(*served)
        self.generation_tokens = GENERATION_TOKENS.labels(*served)
        self.failovers = FAILOVERS.labels(*served)
        self.dead_letters = DEAD_LETTERS.labels(*served)
        self.stolen = STOLEN.labels(*served)
        # Present at 0 from the start, for rate(); resolved once, so an end is one inc.
        self.successes = {reason: REQUEST_SUCCESS.labels(*served, reason) for reason in self.REASONS}
        self.lane_requests = {lane: LANE_REQUESTS.labels(*served, lane) for lane in ("interactive", "batch")}
        self.lane_tokens = {lane: LANE_TOKENS.labels(*served, lane) for lane in ("interactive", "batch")}
        self._gauges: EngineGauges | None = None

    def watch_engine(self, stats: Callable[[], dict]) -> None:
        """Expose this engine's gauges, in place of any engine watched before (one per process)."""
        global _engine_gauges
        with _gauges_lock:
            if _engine_gauges is not None:
                REGISTRY.unregister(_engine_gauges)
            _engine_gauges = self._gauges = EngineGauges(self.model, self.version, stats)
            REGISTRY.register(_engine_gauges)

    def unwatch_engine(self) -> None:
        global _engine_gauges
        with _gauges_lock:
            if _engine_gauges is not None and _engine_gauges is self._gauges:
                REGISTRY.unregister(_engine_gauges)
                _engine_gauges = None

    def on_step(self, decodes: int) -> None:
        if decodes:
            self.batch_size.observe(decodes)

    def finished(self, reason: str, timing: dict, queue_s: float | None, latencies: bool = True) -> None:
        """A done event: counted by reason; latencies only for answers that ran to their end (and
        not for batch lines: `latencies` False)."""
        # A reason beyond the four resolved at start (none today) is looked up, not refused.
        (self.successes.get(reason) or REQUEST_SUCCESS.labels(self.model, self.version, reason)).inc()
        if reason not in self.FULL_RUN or not latencies:
            return
        for histogram, value in ((self.e2e, timing.get("e2e_s")), (self.tpot, timing.get("tpot_s")),
                                 (self.queue_time, queue_s), (self.prefill_time, timing.get("prefill_s"))):
            if value is not None:
                histogram.observe(value)

    def failed(self, code: str) -> None:
        REQUEST_ERRORS.labels(self.model, self.version, code).inc()


@dataclass(frozen=True)
class MetricsEndpoint:
    url: str
    server: object  # the WSGI server, for shutdown

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def serve_metrics(host: str, port: int, advertise_host: str = "") -> MetricsEndpoint | None:
    """Serve REGISTRY on http://host:port/metrics (port 0: any free port) on a daemon thread.

    A port that cannot be bound is one log line, and the worker serves requests without metrics:
    losing the monitoring of one worker must not take its serving capacity with it."""
    try:
        server, _ = start_http_server(port, addr=host, registry=REGISTRY)
    except OSError as exc:
        log.error("event=metrics_unavailable host=%s port=%d error=%r hint=%s", host, port, exc,
                  "set BRIGADE_WORKER_METRICS_PORT to a free port, or 0 for any")
        return None
    bound_port = server.server_address[1]
    shown = advertise_host or host
    if shown in ("", "0.0.0.0", "::"):  # bound to every interface: name the machine instead
        shown = socket.gethostname()
    if ":" in shown:  # an IPv6 literal
        shown = f"[{shown}]"
    url = f"http://{shown}:{bound_port}/metrics"
    log.info("event=metrics_serving url=%s", url)
    return MetricsEndpoint(url, server)
