"""vLLM's names for a worker's own metrics, so that a vLLM Grafana dashboard and inference-perf's
server-side metrics read Brigade unchanged.

Not a second count: at each scrape, `VllmNames` reads the samples of Brigade's own collectors
(workers/metrics.py) and gives the very same numbers again under vLLM's names (VLLM_NAMES), labelled
as vLLM labels them: `model_name` for Brigade's `model`, `engine` "0" (a worker runs one engine),
vLLM's `abort` for Brigade's `cancelled` finish; Brigade's `version` label stays beside them. Two
vLLM names may read one Brigade series (vLLM renamed `time_per_output_token_seconds`, a per-token
gap, to `inter_token_latency_seconds`, and dashboards use both). Histograms keep Brigade's buckets
(LATENCY_BUCKETS): rebucketing would need a second count; a quantile reads them the same way.
docs/metrics.md has the table.
"""
from __future__ import annotations

from typing import Callable, Iterable

from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector
from prometheus_client.samples import Sample

# Brigade's family -> vLLM's families of the same number (vllm/v1/metrics/loggers.py's names).
VLLM_NAMES: dict[str, tuple[str, ...]] = {
    "brigade_num_requests_running": ("vllm:num_requests_running",),
    "brigade_num_requests_waiting": ("vllm:num_requests_waiting",),
    "brigade_kv_cache_usage_perc": ("vllm:kv_cache_usage_perc",),
    "brigade_prefix_cache_queries": ("vllm:prefix_cache_queries",),
    "brigade_prefix_cache_hits": ("vllm:prefix_cache_hits",),
    "brigade_num_preemptions": ("vllm:num_preemptions",),
    "brigade_prompt_tokens": ("vllm:prompt_tokens",),
    "brigade_generation_tokens": ("vllm:generation_tokens",),
    "brigade_request_success": ("vllm:request_success",),
    "brigade_time_to_first_token_seconds": ("vllm:time_to_first_token_seconds",),
    "brigade_inter_token_latency_seconds": ("vllm:inter_token_latency_seconds", "vllm:time_per_output_token_seconds"),
    "brigade_time_per_output_token_seconds": ("vllm:request_time_per_output_token_seconds",),
    "brigade_e2e_request_latency_seconds": ("vllm:e2e_request_latency_seconds",),
    "brigade_request_queue_time_seconds": ("vllm:request_queue_time_seconds",),
    "brigade_request_prefill_time_seconds": ("vllm:request_prefill_time_seconds",),
}
ENGINE_INDEX = "0"  # vLLM's `engine` label: a worker process runs one engine
FINISHED_REASONS = {"cancelled": "abort"}  # Brigade's finish reasons that vLLM names otherwise


def vllm_labels(labels: dict[str, str]) -> dict[str, str]:
    """A Brigade sample's labels as vLLM names them."""
    out = {}
    for name, value in labels.items():
        if name == "model":
            out["model_name"] = value
        elif name == "finished_reason":
            out[name] = FINISHED_REASONS.get(value, value)
        else:
            out[name] = value
    if "model_name" in out:
        out["engine"] = ENGINE_INDEX
    return out


class VllmNames(Collector):
    """Brigade's families of `sources()` (read at each scrape) again under vLLM's names."""

    def __init__(self, sources: Callable[[], Iterable[Collector]]):
        self.sources = sources

    def collect(self) -> Iterable[Metric]:
        for source in self.sources():
            for family in source.collect():
                for name in VLLM_NAMES.get(family.name, ()):
                    renamed = Metric(name, family.documentation, family.type, family.unit)
                    renamed.samples = [Sample(name + s.name[len(family.name):], vllm_labels(s.labels), s.value,
                                              s.timestamp, s.exemplar) for s in family.samples]
                    yield renamed
