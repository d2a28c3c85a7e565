"""vLLM's metric names on a worker's /metrics, scraped from real processes: a real redis-server, one
real `brigade worker`, a real gateway, real HTTP clients, the tiny model (what is counted does not
depend on the words). Each vLLM series a vLLM dashboard or inference-perf reads is there, of vLLM's
type, labelled as vLLM labels it (`model_name`, `engine`, `finished_reason`), and equals Brigade's own
series of the same scrape: the same collectors, not a second count (workers/vllm_metrics.py)."""
from __future__ import annotations

import urllib.request

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.services import Stack, wait_until, worker_statuses
from workers.vllm_metrics import VLLM_NAMES

MODEL = "smollm2-135m-instruct"
# What inference-perf's vLLM client and vLLM's Grafana dashboard read, with vLLM's types.
EXPECTED = {
    "vllm:num_requests_running": "gauge", "vllm:num_requests_waiting": "gauge", "vllm:kv_cache_usage_perc": "gauge",
    "vllm:prefix_cache_queries": "counter", "vllm:prefix_cache_hits": "counter", "vllm:num_preemptions": "counter",
    "vllm:prompt_tokens": "counter", "vllm:generation_tokens": "counter", "vllm:request_success": "counter",
    "vllm:time_to_first_token_seconds": "histogram", "vllm:inter_token_latency_seconds": "histogram",
    "vllm:time_per_output_token_seconds": "histogram", "vllm:request_time_per_output_token_seconds": "histogram",
    "vllm:e2e_request_latency_seconds": "histogram", "vllm:request_queue_time_seconds": "histogram",
    "vllm:request_prefill_time_seconds": "histogram",
}


@pytest.fixture(scope="module")
def stack(redis_server, tiny_model_dir, tmp_path_factory):
    redis_server.client.flushdb()
    with Stack(redis_server, tmp_path_factory.mktemp("vllm-names-logs"), BRIGADE_MODEL=str(tiny_model_dir),
               BRIGADE_CACHE_ENABLED="0", BRIGADE_TORCH_THREADS="1", BRIGADE_MAX_WAIT_MS="20",
               BRIGADE_WORKER_METRICS_PORT=None) as s:
        s.start_gateway()
        s.start_worker("w1@vllm-names")
        s.wait_healthy()
        s.wait_ready()
        yield s


def scrape(url: str) -> dict[str, object]:
    with urllib.request.urlopen(url, timeout=5) as resp:
        return {family.name: family for family in text_string_to_metric_families(resp.read().decode())}


def samples(families: dict, prefix: str) -> dict[tuple, float]:
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for name, family in families.items() if name.startswith(prefix) for s in family.samples}


def test_each_vllm_series_is_there_and_equals_brigades_own_of_the_same_scrape(stack):
    for prompt in ("The capital of France is", "One, two, three,", "Once upon a time"):
        reply = httpx.post(f"{stack.http}/v1/completions", json={"model": MODEL, "prompt": prompt, "max_tokens": 8,
                                                                 "temperature": 0, "ignore_eos": True}, timeout=120)
        assert reply.status_code == 200, reply.text
    # One request its client leaves mid-answer: the worker ends it "cancelled", vLLM's "abort".
    with httpx.stream("POST", f"{stack.http}/v1/completions", timeout=120,
                      json={"model": MODEL, "prompt": "Tell a long story", "max_tokens": 3000, "ignore_eos": True,
                            "stream": True}) as streamed:
        next(streamed.iter_lines())
    url = stack.statuses()["w1@vllm-names"]["metrics_url"]

    def settled():
        families = scrape(url)
        ended = samples(families, "brigade_request_success")
        cancelled = ended.get(("brigade_request_success_total", (("finished_reason", "cancelled"), ("model", MODEL),
                                                                 ("version", ""))), 0)
        idle = not any(s["requests"] for s in worker_statuses(stack.redis.client))
        return families if cancelled == 1 and idle else None

    families = wait_until(settled, 60, interval=0.2, what="the left request to end cancelled, and the worker idle")
    for name, kind in EXPECTED.items():
        assert name in families and families[name].type == kind, (name, families.get(name))
    vllm = samples(families, "vllm:")
    brigade = samples(families, "brigade_")
    renamed_reason = {"cancelled": "abort"}
    expected = {}
    for (name, labels), value in brigade.items():
        family = next((f for f in VLLM_NAMES if name.startswith(f) and name[len(f):] in
                       ("", "_total", "_created", "_bucket", "_count", "_sum")), None)
        for target in VLLM_NAMES.get(family, ()):
            mapped = {"model_name" if k == "model" else k: renamed_reason.get(v, v) if k == "finished_reason" else v
                      for k, v in labels}
            mapped["engine"] = "0"
            expected[(target + name[len(family):], tuple(sorted(mapped.items())))] = value
    assert vllm == expected  # every vLLM sample, and only those, with Brigade's value
    served = (("engine", "0"), ("model_name", MODEL), ("version", ""))
    assert vllm[("vllm:prompt_tokens_total", served)] > 0 and vllm[("vllm:generation_tokens_total", served)] >= 24
    assert vllm[("vllm:time_to_first_token_seconds_count", served)] >= 4
    assert vllm[("vllm:request_success_total", tuple(sorted((*served, ("finished_reason", "length")))))] == 3
    assert vllm[("vllm:request_success_total", tuple(sorted((*served, ("finished_reason", "abort")))))] == 1
    assert vllm[("vllm:inter_token_latency_seconds_count", served)] == \
        vllm[("vllm:time_per_output_token_seconds_count", served)] > 0
