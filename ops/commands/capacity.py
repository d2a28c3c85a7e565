"""`brigade capacity`: how many workers a traffic level needs, from a `bench serve` rate sweep.

Each run of the sweep (its `--json` report) is judged again against the objectives given here,
from its per-request timings. The fastest run that meets them all gives one worker's good rate λ
and its mean end-to-end latency T; by Little's law a worker then holds c = λ·T requests at once.
QPS requests per second need QPS·T requests in flight, so K = ⌈QPS·T / c⌉ workers, which is the
same as ⌈QPS / λ⌉. It assumes workers add up (measure with more than one before trusting a large
K) and that the load balancer keeps them evenly busy; runs made against a gateway with several
workers (their `target_workers`) are divided by that count.
"""
from __future__ import annotations

import json
import math
import sys
from dataclasses import asdict, dataclass

from ops.bench.serve_stats import InvalidObjective, Objective, RequestResult, describe, judge, parse_slo


class NoRunMeetsObjectives(Exception):
    """No run of the sweep met every objective: one worker cannot serve them at any measured rate."""


@dataclass(frozen=True)
class SweepPoint:
    """One bench serve run, per worker."""

    source: str
    offered_rate: float | None  # the run's --rate; None for all at once or closed loop
    good_rate: float  # answers per second per worker, measured
    e2e_mean_s: float  # T: mean end-to-end latency of its answers
    concurrency: float  # requests in flight per worker: good_rate x T (Little's law)
    passed: bool
    failed: tuple[str, ...]  # the objectives it missed, described
    workers: int  # workers behind the gateway during the run


def sweep_point(report: dict, objectives: list[Objective], source: str) -> SweepPoint:
    """Judge one bench serve report against the objectives, from its per-request timings."""
    if report.get("target") != "serve" or "per_request" not in report:
        raise ValueError(f"{source} is not a `brigade bench serve --json` report")
    results = [RequestResult.from_json(row) for row in report["per_request"]]
    duration = float(report["duration_s"])
    verdict = judge(objectives, results, duration)
    workers = int(report["config"].get("target_workers") or 1)
    answers = [r.e2e_s for r in results if r.ok]
    e2e_mean = sum(answers) / len(answers) if answers else math.nan
    good_rate = len(answers) / duration / workers if duration > 0 else 0.0
    return SweepPoint(source, report["config"].get("rate"), good_rate, e2e_mean, good_rate * e2e_mean,
                      verdict["passed"], tuple(describe(v) for v in verdict["objectives"] if not v["passed"]), workers)


def _ceil(x: float) -> int:
    return math.ceil(x - 1e-9)  # 3.0000000001 from float division is 3 workers, not 4


def workers_needed(qps: float, e2e_mean_s: float, concurrency_per_worker: float) -> int:
    """K = ⌈QPS · T / c⌉."""
    return _ceil(qps * e2e_mean_s / concurrency_per_worker)


def plan_capacity(qps: float, points: list[SweepPoint]) -> dict:
    """The workers QPS needs, from the fastest passing run, with every step of the arithmetic."""
    if qps <= 0:
        raise ValueError("--qps must be positive")
    passing = [p for p in points if p.passed and p.good_rate > 0]
    if not passing:
        raise NoRunMeetsObjectives("no run meets every objective: sweep lower rates (or loosen the objectives)")
    best = max(passing, key=lambda p: p.good_rate)
    T, c, rate = best.e2e_mean_s, best.concurrency, best.good_rate
    in_flight = qps * T
    by_concurrency = workers_needed(qps, T, c)
    by_rate = _ceil(qps / rate)
    offered = f", offered {best.offered_rate:g} req/s" if best.offered_rate else ""
    shared = f", {best.workers} workers' throughput divided by {best.workers}" if best.workers > 1 else ""
    steps = [
        f"highest rate meeting every objective: {best.source}, {rate:.4g} answers/s per worker{offered}{shared}",
        f"T = mean end-to-end latency in that run = {T:.4g} s",
        f"concurrency per worker c = rate x T = {rate:.4g} x {T:.4g} = {c:.4g} requests in flight (Little's law)",
        f"in flight at {qps:g} req/s = QPS x T = {qps:g} x {T:.4g} = {in_flight:.4g}",
        f"K = ceil(QPS x T / c) = ceil({in_flight:.4g} / {c:.4g}) = ceil({in_flight / c:.4g}) = {by_concurrency} "
        f"worker{'s' if by_concurrency != 1 else ''}",
        f"check: K = ceil(QPS / rate per worker) = ceil({qps:g} / {rate:.4g}) = {by_rate}",
    ]
    return {"qps": qps, "workers": by_concurrency, "workers_by_rate": by_rate, "chosen": best.source,
            "good_rate_per_worker": round(rate, 6), "e2e_mean_s": round(T, 6),
            "concurrency_per_worker": round(c, 6), "in_flight_needed": round(in_flight, 6), "steps": steps,
            "runs": [asdict(p) for p in points]}


def _table(points: list[SweepPoint]) -> list[str]:
    width = max([len("run")] + [len(p.source) for p in points])
    lines = [f"  {'run':<{width}}   offered   good rate/worker   T (e2e mean)   in flight   verdict"]
    for p in sorted(points, key=lambda p: p.good_rate):
        offered = f"{p.offered_rate:g}/s" if p.offered_rate else "-"
        verdict = "PASS" if p.passed else "FAIL: " + "; ".join(f.removeprefix("FAIL ") for f in p.failed)
        lines.append(f"  {p.source:<{width}}  {offered:>8}   {p.good_rate:>14.4g}/s   {p.e2e_mean_s:>10.4g} s"
                     f"   {p.concurrency:>9.4g}   {verdict}")
    return lines


def run(args) -> int:
    """0 with a plan; 1 when no run meets the objectives; 2 for bad flags or files."""
    try:
        objectives = parse_slo(args.slo)
        points = []
        for path in args.runs:
            with open(path) as fh:
                points.append(sweep_point(json.load(fh), objectives, path))
        plan = plan_capacity(args.qps, points)
    except NoRunMeetsObjectives as exc:
        print("\n".join([f"capacity under {args.slo}:"] + _table(points)), file=sys.stderr)
        print(f"brigade capacity: {exc}", file=sys.stderr)
        return 1
    except (InvalidObjective, ValueError, OSError, KeyError) as exc:
        print(f"brigade capacity: {exc}", file=sys.stderr)
        return 2
    plan["slo"] = args.slo
    if args.json == "-":
        print(json.dumps(plan, indent=2))
        return 0
    print(f"capacity for {args.qps:g} req/s under {args.slo}:")
    print("\n".join(_table(points)))
    print("\n".join("  " + step for step in plan["steps"]))
    if args.json:
        with open(args.json, "w") as fh:
            fh.write(json.dumps(plan, indent=2) + "\n")
    return 0
