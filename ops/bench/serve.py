"""`brigade bench serve`: a load test against a running server, with SLO verdicts.

Like vLLM's `vllm bench serve`: requests arrive open-loop (Poisson, or gamma with `--burstiness`)
at `--rate` per second, or closed-loop with `--max-concurrency` in flight; each is timed as the
client sees it (time to first token, the gaps between pieces, time per output token, end to end).
Two backends: Brigade's WebSocket (`ws`) and the OpenAI streaming API (`openai`, plain httpx SSE,
so the same run can be aimed at vLLM or any OpenAI-compatible server). `--slo` judges the run as
k6's thresholds do: each objective passes or fails, and the command exits 1 when one fails.

The report (JSON on stdout, and `--json FILE`) has the configuration, the measures
(`serve_stats.run_metrics`), the verdicts and every request's own timings, from which
`brigade capacity` can judge other objectives later.
"""
from __future__ import annotations

import asyncio
import datetime
import json
import math
import sys
import time
import uuid
from dataclasses import dataclass
from urllib.parse import urlparse, urlunparse

import httpx
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed, InvalidHandshake, InvalidStatus

from ops.bench.serve_stats import RequestResult, describe, judge, parse_slo, run_metrics
from ops.bench.serve_workload import PlannedRequest, arrival_gaps, load_dataset, plan_requests
from ops.commands.load_flags import DEFAULT_NUM_REQUESTS
from ops.core.redaction import redact, redact_url
from ops.core.settings import Settings

# Requests one WebSocket connection carries at once (the gateway's per-connection limit is 64).
REQUESTS_PER_CONNECTION = 32


@dataclass(frozen=True)
class LoadConfig:
    backend: str  # ws | openai
    url: str  # the endpoint requests go to
    http_base: str  # http(s)://host:port, for /v1/models and /readyz
    model: str | None
    rate: float  # requests per second; inf: all at once (or as slots free, with max_concurrency)
    burstiness: float
    max_concurrency: int | None
    num_requests: int | None
    duration_s: float | None
    max_tokens: int | None
    dataset: str | None
    repeat_ratio: float
    seed: int
    temperature: float
    cache: str | None  # sent as Brigade's `cache` field when set
    timeout_s: float
    api_key: str | None = None
    redis_url: str | None = None  # count this Redis's commands during the run (INFO commandstats)

    def to_json(self) -> dict:
        if self.max_concurrency and math.isinf(self.rate):
            arrivals = "closed loop"
        elif math.isinf(self.rate):
            arrivals = "all at once"
        else:
            arrivals = "poisson" if self.burstiness == 1 else "gamma"
        return {"backend": self.backend, "url": redact_url(self.url), "model": self.model,
                "rate": None if math.isinf(self.rate) else self.rate, "arrivals": arrivals,
                "burstiness": self.burstiness, "max_concurrency": self.max_concurrency,
                "num_requests": self.num_requests, "duration_s": self.duration_s, "max_tokens": self.max_tokens,
                "dataset": self.dataset or "shipped:chat_questions.jsonl", "repeat_ratio": self.repeat_ratio,
                "seed": self.seed, "temperature": self.temperature, "cache": self.cache, "timeout_s": self.timeout_s}


class CannotReach(Exception):
    """The target does not answer at all: nothing to measure."""


def target_urls(backend: str, url: str | None, settings: Settings) -> tuple[str, str]:
    """(the endpoint, the HTTP base) from --url (a base such as http://host:port, with or without /v1,
    or a ws:// URL) or the settings' gateway."""
    if not url:
        base = settings.http_url
    else:
        parts = urlparse(url if "://" in url else f"http://{url}")
        scheme = {"ws": "http", "wss": "https"}.get(parts.scheme, parts.scheme)
        path = parts.path.rstrip("/")
        for suffix in ("/v1/ws", "/v1/chat/completions", "/v1"):
            if path.endswith(suffix):
                path = path[: -len(suffix)]
                break
        base = urlunparse((scheme, parts.netloc, path, "", "", ""))
    if backend == "ws":
        return base.replace("http", "ws", 1) + "/v1/ws", base
    return base + "/v1/chat/completions", base


# ---- the timing of one answer -------------------------------------------------------------------


class AnswerClock:
    """Times one request's pieces as they arrive: the first with text sets TTFT, each next one adds a gap."""

    def __init__(self, result: RequestResult, run_start: float):
        self.result = result
        self.started = time.perf_counter()
        result.start_s = self.started - run_start
        self.last: float | None = None
        self.pieces = 0

    def piece(self, text: str | None) -> None:
        if not text:
            return
        now = time.perf_counter()
        if self.last is None:
            self.result.ttft_s = now - self.started
        else:
            self.result.itl_s.append(now - self.last)
        self.last = now
        self.pieces += 1

    def end(self, error: str | None = None, output_tokens: int | None = None) -> None:
        self.result.e2e_s = time.perf_counter() - self.started
        self.result.error = error
        self.result.output_tokens = output_tokens if output_tokens else self.pieces
        if error is None and self.result.ttft_s is None:
            self.result.ttft_s = self.result.e2e_s  # no text at all: the first token never came before the end


# ---- backends -------------------------------------------------------------------------------------


class OpenAIBackend:
    """POST /v1/chat/completions with `stream: true`, read as SSE with httpx; works with any
    OpenAI-compatible server. Brigade's cache verdict rides in the last chunk's `brigade.cached`."""

    def __init__(self, config: LoadConfig):
        self.config = config
        self.headers = {"Authorization": f"Bearer {config.api_key}"} if config.api_key else {}
        # No pool limit: the load generator must never be what queues the requests.
        self.client = httpx.AsyncClient(timeout=httpx.Timeout(config.timeout_s, connect=10),
                                        limits=httpx.Limits(max_connections=None, max_keepalive_connections=256))
        self.model = config.model

    async def check(self) -> None:
        """The server answers /v1/models; without --model, its first model is the one asked."""
        try:
            r = await self.client.get(self.config.http_base + "/v1/models", headers=self.headers, timeout=10)
        except httpx.HTTPError as exc:
            raise CannotReach(f"{self.config.http_base} does not answer: {exc!r}") from None
        if self.model is None:
            try:
                self.model = r.json()["data"][0]["id"]
            except (ValueError, KeyError, IndexError, TypeError):
                raise CannotReach(f"{self.config.http_base}/v1/models answered {r.status_code} without a model; "
                                  "name one with --model") from None

    def body(self, request: PlannedRequest) -> dict:
        body = {"model": self.model, "messages": list(request.messages), "temperature": self.config.temperature,
                "stream": True, "stream_options": {"include_usage": True}}
        if request.max_tokens:
            body["max_tokens"] = request.max_tokens
        if self.config.cache:
            body["cache"] = self.config.cache
        return body

    async def ask(self, request: PlannedRequest, result: RequestResult, run_start: float) -> None:
        clock = AnswerClock(result, run_start)
        tokens = None
        try:
            async with self.client.stream("POST", self.config.url, json=self.body(request),
                                          headers=self.headers) as r:
                if r.status_code != 200:
                    clock.end(_http_error_code(r.status_code, await r.aread()))
                    return
                error = None
                async for line in r.aiter_lines():
                    if not line.startswith("data:"):
                        continue
                    data = line[5:].strip()
                    if data == "[DONE]":
                        break
                    try:
                        chunk = json.loads(data)
                    except json.JSONDecodeError:
                        error = "invalid_stream"
                        break
                    if "error" in chunk:
                        error = _error_code(chunk["error"], "stream_error")
                        break
                    for choice in chunk.get("choices") or ():
                        clock.piece((choice.get("delta") or {}).get("content") or choice.get("text"))
                        result.finish_reason = choice.get("finish_reason") or result.finish_reason
                    if chunk.get("usage"):
                        tokens = chunk["usage"].get("completion_tokens")
                    extra = chunk.get("brigade")
                    if isinstance(extra, dict):
                        result.cached = extra.get("cached") or None
                        result.finish_reason = extra.get("finish_reason") or result.finish_reason
                clock.end(error, tokens)
        except httpx.ConnectError:
            clock.end("connect_failed")
        except httpx.TimeoutException:
            clock.end("client_timeout")
        except httpx.HTTPError:
            clock.end("connection_closed")

    async def close(self) -> None:
        await self.client.aclose()


def _error_code(error, fallback: str) -> str:
    if isinstance(error, dict):
        code = error.get("code") or error.get("type")
        if code:
            return str(code)
    return fallback


def _http_error_code(status: int, body: bytes) -> str:
    try:
        return _error_code(json.loads(body).get("error"), f"http_{status}")
    except (ValueError, AttributeError):
        return f"http_{status}"


class WebSocketLane:
    """One WebSocket connection carrying many requests; a reader hands each event to its request."""

    def __init__(self, ws: ClientConnection):
        self.ws = ws
        self.waiting: dict[str, asyncio.Queue] = {}
        self.closing_error: str | None = None
        self.reader = asyncio.create_task(self._read())

    async def _read(self) -> None:
        try:
            async for frame in self.ws:
                event = json.loads(frame)
                queue = self.waiting.get(event.get("id"))
                if queue is not None:
                    queue.put_nowait(event)
                elif event.get("type") == "error":
                    self.closing_error = event.get("code")  # e.g. unauthorized, just before a close
        except (ConnectionClosed, json.JSONDecodeError):
            pass
        finally:
            for queue in self.waiting.values():
                queue.put_nowait({"type": "error", "code": self.closing_error or "connection_closed"})

    @property
    def open(self) -> bool:
        return not self.reader.done()


class WebSocketBackend:
    """Brigade's WebSocket protocol, REQUESTS_PER_CONNECTION requests per connection."""

    def __init__(self, config: LoadConfig):
        self.config = config
        self.headers = {"Authorization": f"Bearer {config.api_key}"} if config.api_key else {}
        self.lanes: list[WebSocketLane] = []
        self.opening = asyncio.Lock()
        self.run_id = uuid.uuid4().hex[:6]

    async def check(self) -> None:
        try:
            await self._lane()
        except (OSError, InvalidHandshake, asyncio.TimeoutError) as exc:
            raise CannotReach(f"{self.config.url} does not answer: {exc!r}") from None

    async def _lane(self) -> WebSocketLane:
        async with self.opening:
            for lane in self.lanes:
                if lane.open and len(lane.waiting) < REQUESTS_PER_CONNECTION:
                    return lane
            ws = await connect(self.config.url, additional_headers=self.headers, max_size=None, open_timeout=10)
            lane = WebSocketLane(ws)
            self.lanes.append(lane)
            return lane

    def frame(self, request: PlannedRequest, rid: str) -> dict:
        frame = {"type": "generate", "id": rid, "messages": list(request.messages),
                 "temperature": self.config.temperature}
        if request.max_tokens:
            frame["max_tokens"] = request.max_tokens
        if self.config.model:
            frame["model"] = self.config.model
        if self.config.cache:
            frame["cache"] = self.config.cache
        return frame

    async def ask(self, request: PlannedRequest, result: RequestResult, run_start: float) -> None:
        rid = f"{self.run_id}-{request.index}"
        queue: asyncio.Queue = asyncio.Queue()
        try:
            lane = await self._lane()
        except InvalidStatus as exc:
            AnswerClock(result, run_start).end(f"http_{exc.response.status_code}")
            return
        except (OSError, InvalidHandshake, asyncio.TimeoutError):
            AnswerClock(result, run_start).end("connect_failed")
            return
        lane.waiting[rid] = queue
        clock = AnswerClock(result, run_start)
        ended = False
        try:
            await lane.ws.send(json.dumps(self.frame(request, rid)))
            while True:
                event = await queue.get()
                kind = event.get("type")
                if kind == "token":
                    clock.piece(event.get("text"))
                    if event.get("cached"):
                        result.cached = event["cached"]
                elif kind == "done":
                    result.cached = event.get("cached") or result.cached
                    result.finish_reason = event.get("finish_reason")
                    clock.end(None, (event.get("usage") or {}).get("completion_tokens"))
                    ended = True
                    return
                elif kind == "error":
                    clock.end(event.get("code") or "error")
                    ended = True
                    return
        except ConnectionClosed:
            clock.end(lane.closing_error or "connection_closed")
            ended = True
        finally:
            lane.waiting.pop(rid, None)
            if not ended and lane.open:  # the run's hard timeout cut it short: the server may stop too
                try:
                    await asyncio.shield(lane.ws.send(json.dumps({"type": "cancel", "id": rid})))
                except (ConnectionClosed, asyncio.CancelledError):
                    pass

    async def close(self) -> None:
        for lane in self.lanes:
            await lane.ws.close()
            lane.reader.cancel()


async def gateway_workers(http_base: str) -> int | None:
    """How many workers a Brigade gateway sees (its /readyz); None from another server."""
    try:
        async with httpx.AsyncClient(timeout=5) as client:
            workers = (await client.get(http_base + "/readyz")).json().get("workers")
            return int(workers) if workers is not None else None
    except (httpx.HTTPError, ValueError, AttributeError, TypeError):
        return None


# ---- the run ------------------------------------------------------------------------------------


class Progress:
    """A progress bar on stderr when it is a terminal (rich); nothing otherwise."""

    def __init__(self, total: float | None, by_time: bool):
        self.bar = None
        if sys.stderr.isatty():
            from rich.console import Console
            from rich.progress import BarColumn, MofNCompleteColumn, Progress as Bar, TextColumn, TimeElapsedColumn

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
            _, pending = await asyncio.wait(tasks, timeout=max(0.0, hard_stop - time.perf_counter()))
            for task in pending:
                task.cancel()
            if pending:
                await asyncio.wait(pending)
                now = time.perf_counter()
                for result in results:
                    if result.e2e_s is None:
                        result.e2e_s = now - start - result.start_s
                        result.error = "client_timeout"
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
    if report["errors"]:
        lines.append("  errors: " + ", ".join(f"{code} {n}" for code, n in report["errors"].items()))
    if "redis" in report:
        r = report["redis"]
        lines.append(f"  redis: {r['commands']} commands, {r['per_request']} per request, {r['per_output_token']} per "
                     f"output token, {r['per_second']}/s")
    return lines


async def _bench(config: LoadConfig, objectives) -> dict:
    prompts = load_dataset(config.dataset)
    requests = plan_requests(prompts, config.seed, config.repeat_ratio, config.max_tokens)
    gaps = arrival_gaps(config.rate, config.burstiness, config.seed)
    backend = OpenAIBackend(config) if config.backend == "openai" else WebSocketBackend(config)
    try:
        await backend.check()
        workers = await gateway_workers(config.http_base)
        started_at = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
        before = redis_commands(config.redis_url) if config.redis_url else None
        results, duration = await run_load(backend, config, requests, gaps)
        after = redis_commands(config.redis_url) if config.redis_url else None
    finally:
        await backend.close()
    settings = config.to_json()
    if config.backend == "openai":
        settings["model"] = backend.model
    report = {"target": "serve", "config": {**settings, "started_at": started_at, "target_workers": workers}}
    report.update(run_metrics(results, duration))
    if before is not None:
        report["redis"] = redis_cost(before, after, report)
    if objectives is not None:
        report["slo"] = judge(objectives, results, duration)
    report["per_request"] = [r.to_json() for r in results]
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


# ---- the command line (flags: ops/commands/load_flags.py) ---------------------------------------------


def config_from_args(args, settings: Settings) -> LoadConfig:
    """Checks the flags; raises ValueError with a message for the user."""
    if args.rate <= 0 or args.burstiness <= 0:
        raise ValueError("--rate and --burstiness must be positive")
    if args.max_concurrency is not None and args.max_concurrency < 1:
        raise ValueError("--max-concurrency must be at least 1")
    if args.num_requests is not None and args.num_requests < 1:
        raise ValueError("--num-requests must be at least 1")
    if args.duration is not None and args.duration <= 0:
        raise ValueError("--duration must be positive")
    if not 0 <= args.repeat_ratio <= 1:
        raise ValueError("--repeat-ratio is between 0 and 1")
    if args.timeout <= 0:
        raise ValueError("--timeout must be positive")
    if args.duration is not None and math.isinf(args.rate) and not args.max_concurrency:
        raise ValueError("--duration needs --rate or --max-concurrency (at an unbounded rate it would never stop sending)")
    num_requests = args.num_requests if args.num_requests or args.duration else DEFAULT_NUM_REQUESTS
    url, http_base = target_urls(args.backend, args.url, settings)
    return LoadConfig(
        backend=args.backend, url=url, http_base=http_base, model=args.model, rate=args.rate,
        burstiness=args.burstiness, max_concurrency=args.max_concurrency, num_requests=num_requests,
        duration_s=args.duration, max_tokens=args.max_tokens, dataset=args.dataset, repeat_ratio=args.repeat_ratio,
        seed=args.seed, temperature=args.temperature, cache=args.cache, timeout_s=args.timeout, api_key=args.api_key,
        redis_url=args.redis_url)


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
