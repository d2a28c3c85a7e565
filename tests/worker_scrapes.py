"""A worker's Prometheus /metrics as numbers, and what changed between two scrapes, summed over a
fleet's workers (tests/test_worker_metrics.py; the failover fleet's SIGKILL test,
tests/test_failover.py). Counts are always differences: a fleet's workers served other tests'
requests before."""
from __future__ import annotations

import urllib.request

from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families

MODEL = "smollm2-135m-instruct"  # the served name of the tests' workers, the tiny model's too

Samples = dict[tuple[str, tuple], float]


def families(url: str, created: bool = True) -> dict[str, Metric]:
    """The metric families at `url`, by name; `created=False` leaves out the `_created` gauge
    prometheus_client's text format adds beside each counter and histogram."""
    with urllib.request.urlopen(url, timeout=5) as resp:
        assert resp.status == 200
        text = resp.read().decode()
    return {f.name: f for f in text_string_to_metric_families(text) if created or not f.name.endswith("_created")}


def samples(of: dict[str, Metric], prefix: str = "") -> Samples:
    """Every sample of the families whose name starts with `prefix`, keyed by name and labels."""
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for name, family in of.items() if name.startswith(prefix) for s in family.samples}


def scrape(url: str) -> Samples:
    return samples(families(url))


def value(samples: Samples, name: str, **labels: str) -> float:
    """The sample `name` with exactly these labels besides the model's and its version's (the fleets'
    workers serve the model unversioned: version ""), 0 when absent."""
    want = tuple(sorted({"model": MODEL, "version": "", **labels}.items()))
    return samples.get((name, want), 0.0)


def total(snapshots: dict[str, Samples], name: str, **labels: str) -> float:
    return sum(value(s, name, **labels) for s in snapshots.values())


def delta(before: dict[str, Samples], after: dict[str, Samples], name: str, **labels: str) -> float:
    return total(after, name, **labels) - total(before, name, **labels)
