"""The files an operator deploys with (compose, Prometheus, Grafana) agree with each other and with
the metrics Brigade really exports. No Docker engine runs here, so they are checked as files."""
from __future__ import annotations

import json
import re
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
SUFFIXES = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count"), "gauge": ("",)}


def exported() -> set[str]:
    from gateway.metrics import REGISTRY as gateway_registry
    from workers.metrics import ENGINE_COUNTERS, ENGINE_GAUGES
    from workers.metrics import REGISTRY as worker_registry

    # Registered once a worker has its engine:
    names = {name for name, _ in ENGINE_GAUGES} | {name + "_total" for name, _, _ in ENGINE_COUNTERS}
    for registry in (gateway_registry, worker_registry):
        for family in registry.collect():
            names.update(family.name + suffix for suffix in SUFFIXES[family.type])
    return names


def compose() -> dict:
    return yaml.safe_load((ROOT / "docker-compose.yml").read_text())


def test_every_dashboard_query_names_a_metric_brigade_exports():
    dashboard = json.loads((ROOT / "ops/grafana/dashboards/brigade.json").read_text())
    names = exported()
    used = set()
    for panel in dashboard["panels"]:
        assert panel["targets"], f"panel {panel['title']!r} has no query"
        for target in panel["targets"]:
            found = set(re.findall(r"\bbrigade_[a-z_]+", target["expr"]))
            assert found, f"{panel['title']!r}: {target['expr']!r} names no Brigade metric"
            missing = found - names
            assert not missing, f"{panel['title']!r} queries {sorted(missing)}, which nothing exports"
            used |= found
    titles = " | ".join(p["title"] for p in dashboard["panels"]).lower()
    for wanted in ("time to first token", "time per output token", "throughput", "queue", "kv", "hit rate",
                   "workers alive"):
        assert wanted in titles, f"no panel about {wanted}"
    assert {"brigade_time_to_first_token_seconds_bucket", "brigade_kv_cache_usage_perc",
            "brigade_workers_alive"} <= used


def test_prometheus_scrapes_the_gateway_and_every_worker_where_compose_serves_them():
    services = compose()["services"]
    config = yaml.safe_load((ROOT / "ops/prometheus.yml").read_text())
    jobs = {job["job_name"]: job for job in config["scrape_configs"]}
    gateway_target = jobs["brigade-gateway"]["static_configs"][0]["targets"][0]
    host, port = gateway_target.split(":")
    assert host == "gateway" and f"{port}:{port}" in services["gateway"]["ports"]
    workers = jobs["brigade-worker"]["dns_sd_configs"][0]
    assert workers["names"] == ["worker"] and "worker" in services
    assert str(workers["port"]) == services["worker"]["environment"]["BRIGADE_WORKER_METRICS_PORT"]
    assert services["worker"]["environment"]["BRIGADE_WORKER_METRICS_HOST"] == "0.0.0.0"
    for job in jobs.values():
        assert job["metrics_path"] == "/metrics"


def test_compose_mounts_files_that_exist_and_grafana_provisions_the_dashboard():
    services = compose()["services"]
    for name in ("prometheus", "grafana"):
        for volume in services[name]["volumes"]:
            source = volume.split(":")[0]
            assert (ROOT / source).exists(), f"{name} mounts {source}, which is not in the repository"
    provider = yaml.safe_load((ROOT / "ops/grafana/provisioning/dashboards/brigade.yml").read_text())
    path = provider["providers"][0]["options"]["path"]
    assert any(v.endswith(":" + path + ":ro") for v in services["grafana"]["volumes"])
    source = yaml.safe_load((ROOT / "ops/grafana/provisioning/datasources/prometheus.yml").read_text())
    assert source["datasources"][0]["url"] == "http://prometheus:9090"
    dashboard = json.loads((ROOT / "ops/grafana/dashboards/brigade.json").read_text())
    assert all(t["datasource"]["uid"] == source["datasources"][0]["uid"] for p in dashboard["panels"]
               for t in p["targets"])


def test_the_redis_ha_profile_is_a_primary_two_replicas_and_three_sentinels_that_the_documented_url_reaches():
    import re

    from ops.core.redis_address import parse_sentinel

    services = compose()["services"]
    ha = {name: s for name, s in services.items() if "redis-ha" in (s.get("profiles") or [])}
    assert sorted(ha) == ["redis-primary", "redis-replica1", "redis-replica2", "sentinel1", "sentinel2", "sentinel3"]
    for replica in ("redis-replica1", "redis-replica2"):
        command = ha[replica]["command"]
        assert command[command.index("--replicaof") + 1:command.index("--replicaof") + 3] == ["redis-primary", "6379"]
    for sentinel in ("sentinel1", "sentinel2", "sentinel3"):
        script = ha[sentinel]["command"][-1]
        assert "sentinel monitor brigade redis-primary 6379 2" in script and "--sentinel" in script
    # the URL the file's header tells operators to set names those sentinels and that master
    header = (ROOT / "docker-compose.yml").read_text()
    url = re.search(r"BRIGADE_REDIS_URL=(redis\+sentinel://\S+)", header).group(1)
    address = parse_sentinel(url)
    assert address.master == "brigade" and [h for h, _ in address.sentinels] == ["sentinel1", "sentinel2", "sentinel3"]
    assert {p for _, p in address.sentinels} == {26379}
    assert services["gateway"]["environment"]["BRIGADE_REDIS_URL"].startswith("${BRIGADE_REDIS_URL:-")
