"""`brigade bench serve`: a load test against a running server, with SLO verdicts.

Like vLLM's `vllm bench serve`: requests arrive open-loop (Poisson, or gamma with `--burstiness`)
at `--rate` per second, or closed-loop with `--max-concurrency` in flight; each is timed as the
client sees it (time to first token, the gaps between pieces, time per output token, end to end).
Two backends: Brigade's WebSocket (`ws`) and the OpenAI streaming API (`openai`, plain httpx SSE,
so the same run can be aimed at vLLM or any OpenAI-compatible server). `--slo` judges the run as
k6's thresholds do: each objective passes or fails, and the command exits 1 when one fails.

The report (JSON on stdout, and `--json FILE`) has the configuration, the measures
(`serve_stats.run_metrics`), the verdicts and every request's own timings, from which
`brigade capacity` can judge other objectives later. `--workload chat-turns` sends conversations
instead of independent requests (serve_conversations.py), and adds TTFT by turn and the workers'
prefix-cache hit ratio.

Here: the run (the arrival schedule, the hard timeout, Redis's cost) and the command; the
configuration and its flags are serve_config.py's, asking and timing one request serve_backends.py's.
"""
from __future__ import annotations

import asyncio
import datetime
import json
import sys
import time

from ops.bench.conversations import plan_conversations
from ops.bench.prefix_counters import read_prefix_counters
from ops.bench.serve_backends import CannotReach, OpenAIBackend, WebSocketBackend, gateway_workers
from ops.bench.serve_config import LoadConfig, config_from_args
from ops.bench.serve_conversations import conversation_measures, run_conversations
from ops.bench.serve_stats import RequestResult, await_or_time_out, describe, judge, parse_slo, run_metrics
from ops.bench.serve_workload import PlannedRequest, arrival_gaps, load_dataset, plan_requests
from ops.core.redaction import redact
from ops.core.settings import Settings

# ---- the run ------------------------------------------------------------------------------------


class Progress:
    """A progress bar on stderr when it is a terminal (rich); nothing otherwise."""

    def __init__(self, total: float | None, by_time: bool):
        self.bar = None
        if sys.stderr.isatty():
            from rich.console import Console
            from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeElapsedColumn
            from rich.progress import Progress as Bar

            self.bar = Bar(TextColumn("bench serve"), BarColumn(), MofNCompleteColumn(), TextColumn("{task.fields[note]}"),
                           TimeElapsedColumn(), console=Console(stderr=True), transient=True)
            self.task = self.bar.add_task("requests", total=None if by_time else total, note="")
            self.bar.start()
        self.done = 0
        self.failed = 0

    def finished(self, result: RequestResult) -> None:
        self.done += 1
        self.failed += not result.ok
        if self.bar is not None:
            self.bar.update(self.task, advance=1, note=f"{self.failed} failed" if self.failed else "")

    def stop(self) -> None:
        if self.bar is not None:
            self.bar.stop()


async def run_load(backend, config: LoadConfig, requests, gaps) -> tuple[list[RequestResult], float]:
    """Send requests on the arrival schedule until --num-requests were sent or --duration passed; wait
    for them, but never past the hard timeout (what is still running then is cancelled and counted as
    `client_timeout`). Returns the results and the run's duration (the start to the last answer)."""
    results: list[RequestResult] = []
    tasks: list[asyncio.Task] = []
    slots = asyncio.Semaphore(config.max_concurrency) if config.max_concurrency else None
    progress = Progress(config.num_requests, config.num_requests is None)
    start = time.perf_counter()
    hard_stop = start + config.timeout_s
    ends: list[float] = []

    async def one(request: PlannedRequest, result: RequestResult) -> None:
        try:
            await backend.ask(request, result, start)
        finally:
            ends.append(time.perf_counter())
            if slots is not None:
                slots.release()
            progress.finished(result)

    next_at = 0.0
    try:
        while config.num_requests is None or len(results) < config.num_requests:
            if config.duration_s is not None and next_at >= config.duration_s:
                break
            delay = start + next_at - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(min(delay, max(0.0, hard_stop - time.perf_counter())))
            if slots is not None:  # closed loop: the next request waits for a free slot
                try:
                    await asyncio.wait_for(slots.acquire(), max(0.001, hard_stop - time.perf_counter()))
                except asyncio.TimeoutError:
                    break
            if time.perf_counter() >= hard_stop:
                if slots is not None:
                    slots.release()
                break
            if config.duration_s is not None and time.perf_counter() - start >= config.duration_s:
                if slots is not None:
                    slots.release()
                break
            request = next(requests)
            result = RequestResult(request.index, request.kind)
            results.append(result)
            tasks.append(asyncio.create_task(one(request, result)))
            next_at += next(gaps)
        if tasks:
            await await_or_time_out(tasks, hard_stop - time.perf_counter(), results, start)
    finally:
        progress.stop()
    duration = (max(ends) if ends else time.perf_counter()) - start
    return results, duration


def _summary_lines(report: dict) -> list[str]:
    """A human summary for stderr, as vLLM prints one."""
    def ms(d: dict, key: str) -> str:
        value = d.get(key)
        return "-" if value is None else f"{value * 1000:.1f}"

    c = report["config"]
    lines = [f"bench serve: {c['backend']} {c['url']}, {c['arrivals']}"
             + (f" at {c['rate']}/s" if c["rate"] else "")
             + (f", max concurrency {c['max_concurrency']}" if c["max_concurrency"] else ""),
             f"  requests: {report['requests']['completed']} completed, {report['requests']['failed']} failed "
             f"in {report['duration_s']:.1f} s; {report['request_throughput']} req/s, "
             f"{report['output_token_throughput']} output tok/s; cache hits {report['cache']['hits']}",
             "  latency (ms)   mean      p50      p90      p95      p99"]
    for metric in ("ttft", "tpot", "itl", "e2e"):
        d = report[f"{metric}_s"]
        lines.append(f"  {metric:<10}" + "".join(f"{ms(d, k):>9}" for k in ("mean", "p50", "p90", "p95", "p99")))
    if "ttft_s_by_turn" in report:
        lines.append("  ttft by turn (ms, p50/p95): " + ", ".join(
            f"{turn}: {ms(d, 'p50')}/{ms(d, 'p95')}" for turn, d in report["ttft_s_by_turn"].items()))
        p = report["prefix_cache"]
        if p["queries"] is None:
            lines.append(f"  prefix cache: {p['reason']}")
        else:
            lines.append(f"  prefix cache: {p['hits']} of {p['queries']} prompt tokens found ({p['hit_ratio']}) "
                         f"on {p['workers']} worker(s)")
    if report["errors"]:
        lines.append("  errors: " + ", ".join(f"{code} {n}" for code, n in report["errors"].items()))
    if "redis" in report:
        r = report["redis"]
        lines.append(f"  redis: {r['commands']} commands, {r['per_request']} per request, {r['per_output_token']} per "
                     f"output token, {r['per_second']}/s")
    return lines


async def _bench(config: LoadConfig, objectives) -> dict:
    chat = config.chat_turns
    if chat is None:  # a bad dataset is refused before anything is sent
        requests = plan_requests(load_dataset(config.dataset), config.seed, config.repeat_ratio, config.max_tokens)
        gaps = arrival_gaps(config.rate, config.burstiness, config.seed)
    backend = OpenAIBackend(config) if config.backend == "openai" else WebSocketBackend(config)
    try:
        await backend.check()
        workers = await gateway_workers(config.http_base)
        started_at = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
        if chat is not None:  # read outside Redis's count of the run's commands
            prefix_before = await asyncio.to_thread(read_prefix_counters, config.workers_redis_url)
        before = redis_commands(config.redis_url) if config.redis_url else None
        if chat is None:
            results, duration = await run_load(backend, config, requests, gaps)
        else:
            turns, duration = await run_conversations(backend, config, plan_conversations(chat),
                                                      Progress(chat.requests, False))
            results = [t.result for t in turns]
        after = redis_commands(config.redis_url) if config.redis_url else None
        if chat is not None:
            prefix_after = await asyncio.to_thread(read_prefix_counters, config.workers_redis_url)
    finally:
        await backend.close()
    settings = config.to_json()
    if config.backend == "openai":
        settings["model"] = backend.model
    report = {"target": "serve", "config": {**settings, "started_at": started_at, "target_workers": workers}}
    report.update(run_metrics(results, duration))
    if chat is not None:
        report.update(conversation_measures(turns, chat, prefix_before, prefix_after))
    if before is not None:
        report["redis"] = redis_cost(before, after, report)
    if objectives is not None:
        report["slo"] = judge(objectives, results, duration)
    report["per_request"] = [r.to_json() for r in (results if chat is None else turns)]
    return report


def redis_commands(url: str) -> dict[str, int]:
    """Calls per command since the server started (commands run by scripts included)."""
    from ops.core import redis_clients

    client = redis_clients.client(url)
    try:
        return {k.removeprefix("cmdstat_"): int(v["calls"]) for k, v in client.info("commandstats").items()}
    finally:
        client.close()


def redis_cost(before: dict[str, int], after: dict[str, int], report: dict) -> dict:
    """What the run cost Redis, by everyone using it meanwhile (heartbeats and monitors included)."""
    calls = {k: n - before.get(k, 0) for k, n in after.items() if n - before.get(k, 0) > 0}
    calls.pop("info", None)  # this measurement's own
    total = sum(calls.values())
    done, tokens, seconds = report["requests"]["completed"], report["total_output_tokens"], report["duration_s"]
    return {"commands": total, "per_request": round(total / done, 2) if done else None,
            "per_output_token": round(total / tokens, 3) if tokens else None,
            "per_second": round(total / seconds, 1) if seconds else None,
            "by_command": dict(sorted(calls.items(), key=lambda kv: -kv[1]))}


def run(config: LoadConfig, slo: str | None = None) -> dict:
    """One load test; the report as a dict. Raises InvalidObjective, InvalidDataset, CannotReach."""
    objectives = parse_slo(slo) if slo else None
    return asyncio.run(_bench(config, objectives))


# ---- the command line (flags: ops/commands/load_flags.py; checked in serve_config.py) --------------


def main(args, settings: Settings) -> int:
    """`brigade bench serve`: 0 when every objective passed (or none was given), 1 when one failed,
    2 for bad flags, a bad dataset or a target that does not answer."""
    try:
        config = config_from_args(args, settings)
        report = run(config, args.slo)
    except (ValueError, OSError, CannotReach) as exc:  # bad flags, objectives or dataset; nothing answers
        print(f"brigade bench serve: {redact(str(exc))}", file=sys.stderr)  # a URL may hold a password
        return 2
    text = json.dumps(report, indent=2)
    print(text)
    if args.json:
        with open(args.json, "w") as fh:
            fh.write(text + "\n")
    for line in _summary_lines(report):
        print(line, file=sys.stderr)
    if args.plot:
        from ops.bench.plot import plot_run

        plot_run(report, args.plot)
        print(f"  plot: {args.plot}", file=sys.stderr)
    if "slo" not in report:
        return 0
    for verdict in report["slo"]["objectives"]:
        print("  " + describe(verdict), file=sys.stderr)
    print(f"  goodput: {report['slo']['goodput']} req/s ({report['slo']['good_requests']} of "
          f"{report['requests']['sent']} requests met every latency objective)", file=sys.stderr)
    return 0 if report["slo"]["passed"] else 1
