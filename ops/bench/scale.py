"""`brigade bench scale`: output tokens/s as the fleet grows, under the same load.

For each fleet size it starts its own Brigade (`brigade up --ephemeral --workers N`: a fresh
redis-server, the gateway, a reaper and N workers of BRIGADE_TORCH_THREADS each, on free ports, the answer
cache off so that every request reaches a worker), waits until all N workers beat, runs the
same `bench serve` load against it, and stops it. Reported per size: output tokens/s, requests/s,
TTFT and end-to-end medians, errors, and the ratio to the first size.

With `--routing shared,prefix` each size is started once per routing mode (BRIGADE_ROUTING in the
fleet's environment), one row per (size, routing), each row's ratio to the first size under the
same routing. Under `--workload chat-turns` a row also has the TTFT p95, the TTFT by turn and the
workers' prefix-cache hit ratio over its run (bench serve's `prefix_cache`).
"""
from __future__ import annotations

import dataclasses
import os
import signal
import sys
import tempfile
from pathlib import Path

from ops.bench.serve import run as run_load
from ops.bench.serve_config import LoadConfig
from ops.core.ports import free_port
from ops.core.settings import Settings
from ops.stack.stack import ROOT, Stack, readyz_workers
from ops.stack.supervision import PartExited
START_TIMEOUT_S = 300.0
ROUTINGS = ("shared", "prefix")  # BRIGADE_ROUTING's values (ops/core/settings.py, routing)


def parse_sizes(text: str) -> list[int]:
    try:
        sizes = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise ValueError(f"--workers takes fleet sizes separated by commas, e.g. 1,2 (got {text!r})") from None
    if not sizes or min(sizes) < 1:
        raise ValueError("--workers needs fleet sizes of at least 1, e.g. 1,2")
    return sizes


def parse_routings(text: str | None) -> list[str] | None:
    """--routing's modes in order; None when not given (the fleet's default routing, no routing
    column)."""
    if text is None:
        return None
    modes = [m.strip() for m in text.split(",") if m.strip()]
    unknown = [m for m in modes if m not in ROUTINGS]
    if not modes or unknown:
        raise ValueError(f"--routing takes modes separated by commas, of {', '.join(ROUTINGS)} (got {text!r})")
    return modes


class Fleet:
    """`brigade up --workers N` in its own process session, on free ports, with its own Redis; the
    model, the home it is prepared in and the engine's width are the benchmark's own settings'."""

    def __init__(self, workers: int, torch_threads: int, log_dir: Path, settings: Settings,
                 extra_env: dict[str, str] | None = None, tag: str = ""):
        self.workers = workers
        self.port = free_port()
        self.redis_port = free_port()
        self.name = f"fleet-{workers}{tag}"
        env = {k: v for k, v in os.environ.items() if not k.startswith("BRIGADE_")}
        env.update({
            "BRIGADE_REDIS_URL": f"redis://127.0.0.1:{self.redis_port}/0",
            "BRIGADE_GATEWAY_HOST": "127.0.0.1", "BRIGADE_GATEWAY_PORT": str(self.port),
            "BRIGADE_TORCH_THREADS": str(torch_threads), "BRIGADE_CACHE_ENABLED": "0",
            "BRIGADE_WORKER_METRICS_PORT": "0", "BRIGADE_LOG_LEVEL": "INFO",
            "BRIGADE_MAX_QUEUE_DEPTH": "100000",  # the load, not admission, is what is measured
        })
        env.update({
            "BRIGADE_HOME": str(settings.home), "BRIGADE_MODEL": settings.model,
            "BRIGADE_MAX_BATCH": str(settings.max_batch), "BRIGADE_WORKER_CONCURRENCY": str(settings.worker_concurrency),
        })
        env.update(extra_env or {})
        self.env = env
        # One part, `up` itself, which supervises the fleet's own parts; it stops them in order
        # when it gets SIGTERM, and gets SIGTERM too should this benchmark die.
        self.stack = Stack(env, log_dir, order=("up",), grace_s={"up": 60.0}, cwd=ROOT)
        self.supervisor = self.stack.supervisor

    def __enter__(self) -> "Fleet":
        # --ephemeral: each size gets a fresh, empty Redis, not the last size's queue and records.
        self.stack.start("up", self.name, ["--ephemeral", "--workers", str(self.workers)], death_signal=signal.SIGTERM)
        self.log_path = self.stack.log(self.name)  # the Stack names it
        try:
            self.supervisor.wait_for(lambda: self.ready_workers() >= self.workers, START_TIMEOUT_S, interval_s=0.5)
        except PartExited:
            self.supervisor.stop()
            raise RuntimeError(f"the fleet of {self.workers} exited while starting; its log: {self.log_path}") from None
        except TimeoutError:
            self.supervisor.stop()
            raise RuntimeError(f"the fleet of {self.workers} was not ready in {START_TIMEOUT_S:.0f} s; "
                               f"its log: {self.log_path}") from None
        return self

    @property
    def redis_url(self) -> str:
        return self.env["BRIGADE_REDIS_URL"]

    def ready_workers(self) -> int:
        return readyz_workers(f"http://127.0.0.1:{self.port}") or 0

    def __exit__(self, *exc) -> None:
        self.supervisor.stop()


def row(workers: int, report: dict, routing: str | None = None) -> dict:
    out = {
        "workers": workers,
        "tok_s": report["output_token_throughput"],
        "req_s": report["request_throughput"],
        "output_tokens": report["total_output_tokens"],
        "duration_s": report["duration_s"],
        "ttft_p50_s": report["ttft_s"]["p50"],
        "e2e_p50_s": report["e2e_s"]["p50"],
        "errors": report["requests"]["failed"],
    }
    if routing is not None:
        out["routing"] = routing
    if "prefix_cache" in report:  # the chat-turns workload
        out["ttft_p95_s"] = report["ttft_s"]["p95"]
        out["ttft_s_by_turn"] = {turn: {"p50": d["p50"], "p95": d["p95"]}
                                 for turn, d in report["ttft_s_by_turn"].items()}
        out["prefix_hit_ratio"] = report["prefix_cache"]["hit_ratio"]
        out["prefix_cache"] = report["prefix_cache"]
    return out


def run(sizes: list[int], load: LoadConfig, settings: Settings, torch_threads: int = 1,
        log_dir: Path | None = None, routings: list[str] | None = None) -> dict:
    """The same load against each fleet size in turn, under each routing mode when `routings` are
    given; the report as a dict."""
    log_dir = log_dir or Path(tempfile.mkdtemp(prefix="brigade-bench-scale-"))
    results = []
    for n in sizes:
        for routing in routings or [None]:
            env, tag = ({"BRIGADE_ROUTING": routing}, f"-{routing}") if routing else (None, "")
            with Fleet(n, torch_threads, log_dir, settings, env, tag) as fleet:
                http_base = f"http://127.0.0.1:{fleet.port}"
                url = f"ws://127.0.0.1:{fleet.port}/v1/ws" if load.backend == "ws" else f"{http_base}/v1"
                config = dataclasses.replace(load, url=url, http_base=http_base, api_key=None,
                                             workers_redis_url=fleet.redis_url if load.chat_turns else None)
                results.append(row(n, run_load(config), routing))
            r = results[-1]
            line = f"  {n} worker(s)" + (f", {routing} routing" if routing else "")
            line += f": {r['tok_s']:.1f} output tok/s, {r['errors']} errors"
            if "prefix_hit_ratio" in r:
                line += f", prefix hit ratio {r['prefix_hit_ratio']}"
            print(line, file=sys.stderr, flush=True)
    for r in results:  # against the first size under the same routing
        base = next(b["tok_s"] for b in results if b.get("routing") == r.get("routing")) or None
        r["ratio"] = round(r["tok_s"] / base, 3) if base else None
    return {"target": "scale", "torch_threads_per_worker": torch_threads, "load": load.to_json(), "logs": str(log_dir),
            "results": results}
