"""vLLM's metric names on a worker's /metrics, on the two-worker fleet of tests/test_worker_metrics.py
(which imports this test so that it runs on that module's stack instead of starting another; its
`fleet` fixture is that module's; not collected on its own: no test_ prefix). Each vLLM series a
vLLM dashboard or inference-perf reads is there, of vLLM's type, labelled as vLLM labels it
(`model_name`, `engine`, `finished_reason`), and equals Brigade's own series of the same scrape: the
same collectors, not a second count (workers/vllm_metrics.py). The counts are differences between
two scrapes, summed over the fleet's workers, since the fleet served other tests' requests before."""
from __future__ import annotations

import httpx

from tests.services import wait_until, worker_statuses
from tests.worker_scrapes import MODEL, families, samples
from workers.vllm_metrics import VLLM_NAMES

FLEET = ("w1@metrics", "w2@metrics")  # test_worker_metrics' workers
SERVED = (("engine", "0"), ("model_name", MODEL), ("version", ""))
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


def vllm_scrapes(fleet) -> dict[str, dict]:
    """Every fleet worker's /metrics as metric families, by worker."""
    return {n: families(s["metrics_url"]) for n, s in fleet.statuses(FLEET).items()}


def vllm_total(scrapes: dict[str, dict], name: str, **labels: str) -> float:
    want = tuple(sorted({**dict(SERVED), **labels}.items()))
    return sum(samples(scraped, "vllm:").get((name, want), 0.0) for scraped in scrapes.values())


def test_each_vllm_series_is_there_and_equals_brigades_own_of_the_same_scrape(fleet):
    def idle() -> bool:
        return not any(s["requests"] for s in worker_statuses(fleet.redis.client))

    wait_until(idle, 60, interval=0.2, what="the fleet idle before the first scrape")
    before = vllm_scrapes(fleet)
    for prompt in ("The capital of France is", "One, two, three,", "Once upon a time"):
        reply = httpx.post(f"{fleet.http}/v1/completions", json={"model": MODEL, "prompt": prompt, "max_tokens": 8,
                                                                 "temperature": 0, "ignore_eos": True}, timeout=120)
        assert reply.status_code == 200, reply.text
    # One request its client leaves mid-answer: the worker ends it "cancelled", vLLM's "abort".
    with httpx.stream("POST", f"{fleet.http}/v1/completions", timeout=120,
                      json={"model": MODEL, "prompt": "Tell a long story", "max_tokens": 3000, "ignore_eos": True,
                            "stream": True}) as streamed:
        next(streamed.iter_lines())

    def settled():
        scrapes = vllm_scrapes(fleet)
        aborted = vllm_total(scrapes, "vllm:request_success_total", finished_reason="abort") \
            - vllm_total(before, "vllm:request_success_total", finished_reason="abort")
        return scrapes if aborted == 1 and idle() else None

    after = wait_until(settled, 60, interval=0.2, what="the left request to end cancelled, and the fleet idle")
    for scraped in after.values():
        for name, kind in EXPECTED.items():
            assert name in scraped and scraped[name].type == kind, (name, scraped.get(name))
        assert samples(scraped, "vllm:") == vllm_as_brigade(samples(scraped, "brigade_"))

    def grew(name: str, **labels: str) -> float:
        return vllm_total(after, name, **labels) - vllm_total(before, name, **labels)

    assert grew("vllm:prompt_tokens_total") > 0 and grew("vllm:generation_tokens_total") >= 24
    assert grew("vllm:time_to_first_token_seconds_count") >= 4
    assert grew("vllm:request_success_total", finished_reason="length") == 3
    assert grew("vllm:request_success_total", finished_reason="abort") == 1
    assert grew("vllm:inter_token_latency_seconds_count") == grew("vllm:time_per_output_token_seconds_count") > 0


def vllm_as_brigade(brigade: dict[tuple, float]) -> dict[tuple, float]:
    """The vLLM samples a worker must show: each of Brigade's series under vLLM's name and labels,
    with Brigade's value (every vLLM sample, and only those)."""
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
    return expected
