"""`brigade bench chaos`: the whole fleet under load while every kind of fault happens to it in turn.

A fleet of its own on free ports (ops/bench/fleet.py): a Redis primary, one replica and three
sentinels, two gateways, two workers and a reaper. The load, for `seconds`: WebSocket clients
round-robin over the gateways, OpenAI SSE streaming clients, and one batch job
(ops/bench/load_clients.py, ops/bench/batch_load.py). The faults, on a schedule (`schedule`):
- a worker SIGKILLed every `kill_worker_every_s` and started again;
- the Redis primary SIGKILLed `redis_primary_kills` times (the node is started again once the
  sentinels promoted the replica; it rejoins as a replica);
- a gateway SIGKILLed `gateway_kills` times (the one running the batch job when there is one),
  and started again: its WebSocket clients resume on the other gateway; its SSE streams are cut;
- one worker cut from Redis for `cut_s` while its process runs on: it lives in a network
  namespace (ops/bench/netns.py) and the namespace's end of its link goes down, then up.
One fault at a time: each waits until the fleet is whole again (every worker beating, both gateways
ready, the Redis set healthy), for at most WHOLE_WAIT_S, since "no request lost to any single
fault" is the claim under test. The report (JSON) holds what each door's clients saw, the batch
job's check, every fault with its time, every process's memory and the goal's figures.
"""
from __future__ import annotations

import asyncio
import re
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import asdict, dataclass
from pathlib import Path

import httpx
import redis

from ops.bench.batch_load import BatchLoad
from ops.bench.fleet import Fleet
from ops.bench.load_clients import Deadline, Tally, sse_client, websocket_client
from ops.bench.netns import CutLink, NamespaceUnavailable
from ops.core import redis_keys
from ops.stack.supervision import PartExited, say

ROOT = Path(__file__).resolve().parents[2]
WHOLE_WAIT_S = 120  # a fault waits this long at most for the fleet to be whole after the last one
MEMORY_EVERY_S = 10
# Memory is flat when no Brigade process that ran the whole load grew, from the warm-up sample
# (after the connections were opened) to the end, by more than this share or this many MB.
FLAT_SHARE, FLAT_MB = 0.10, 25.0
# Log events worth counting in the report: the machinery that kept requests whole, at work.
EVENTS = ("reaped", "fenced", "orphan_requeued", "unclaimed_requeued", "log_refill", "publish_failed",
          "publish_recovered", "publish_abandoned", "claim_unconfirmed", "reply_router_reconnect",
          "reply_router_reconnected", "heartbeat_failed", "dead_lettered", "resumed")
SENTINEL_EVENTS = ("+switch-master", "+tilt", "-failover-abort-no-good-slave")


@dataclass
class ChaosConfig:
    seconds: float = 600
    clients: int = 200
    sse_clients: int = 20
    batch_lines: int = 1000
    kill_worker_every_s: float = 60
    redis_primary_kills: int = 2
    gateway_kills: int = 1
    cut_s: float = 30
    max_tokens: int = 16
    model: str | None = None  # a model folder or name; None: the default model (BRIGADE_MODEL or SmolLM2)
    batch_wait_s: float = 600  # after the load, how long the batch job may take to finish


@dataclass
class Fault:
    at_s: float
    kind: str  # worker_kill, redis_primary_kill, gateway_kill, worker_cut


def schedule(config: ChaosConfig) -> list[Fault]:
    """Worker kills every kill_worker_every_s; the cut, then primary and gateway kills taking turns,
    spread evenly from 15% to 80% of the run (600 s: the cut at 90 s, the primary at 220 and 480 s,
    the gateway at 350 s). Nothing in the last 5 s: its effect would not be seen."""
    faults = []
    if config.kill_worker_every_s > 0:
        t = config.kill_worker_every_s
        while t < config.seconds - 5:
            faults.append(Fault(t, "worker_kill"))
            t += config.kill_worker_every_s
    others = ["worker_cut"] if config.cut_s > 0 else []
    primaries, gateways = config.redis_primary_kills, config.gateway_kills
    while primaries or gateways:
        if primaries:
            others.append("redis_primary_kill")
            primaries -= 1
        if gateways:
            others.append("gateway_kill")
            gateways -= 1
    for i, kind in enumerate(others):
        share = 0.15 + 0.65 * i / (len(others) - 1) if len(others) > 1 else 0.15
        faults.append(Fault(round(config.seconds * share, 1), kind))
    return sorted(faults, key=lambda f: f.at_s)


class Chaos:
    """One run: the fleet, its clients, the faults as they happen, and what was measured."""

    def __init__(self, fleet: Fleet, link: CutLink | None, config: ChaosConfig):
        self.fleet, self.link, self.config = fleet, link, config
        self.t0 = time.monotonic()
        self.ws, self.sse = Tally(self.t0), Tally(self.t0)
        self.batch = BatchLoad(fleet.http_urls, config.batch_lines, config.max_tokens)
        self.faults: list[dict] = []
        self.load_s: float | None = None  # how long the clients asked: `seconds`, or more (`run`)
        self.gateway_kills: list[tuple[int, float]] = []
        self.memory: dict[str, list[tuple[float, float | None]]] = {}

    def now(self) -> float:
        return round(time.monotonic() - self.t0, 1)

    def killed_between(self, gateway: int, start: float, end: float) -> bool:
        return any(g == gateway and start <= t <= end for g, t in self.gateway_kills)

    async def run(self) -> dict:
        c = self.config
        self.t0 = self.ws.t0 = self.sse.t0 = time.monotonic()
        # The load lasts `seconds`, and longer while a planned fault still waits for a whole fleet
        # (each fault waits for the last one's repairs): every fault happens under load, and the
        # load goes on 5 s past the last, so that its effect is seen.
        until = Deadline(self.t0 + c.seconds, held=True)
        self.sample_memory()
        await self.batch.submit()
        tasks = [asyncio.create_task(websocket_client(self.fleet.ws_urls, n, until, c.max_tokens, self.ws))
                 for n in range(c.clients)]
        tasks += [asyncio.create_task(sse_client(self.fleet.http_urls, n, until, c.max_tokens, self.sse,
                                                 self.killed_between)) for n in range(c.sse_clients)]
        sampler = asyncio.create_task(self.sample_memory_every())
        for fault in schedule(c):
            while self.now() < fault.at_s:
                await asyncio.sleep(0.2)
            self.faults.append(await self.apply(fault))
            until.at_least(time.monotonic() + 5)
        until.held = False
        while not until.passed():
            await asyncio.sleep(0.2)
        self.load_s = self.now()
        await self.batch.poll()
        self.batch.note("load_end")
        # Requests in flight at the deadline are finished, not abandoned.
        await asyncio.wait_for(asyncio.gather(*tasks), 600)
        await self.batch.follow(time.monotonic() + c.batch_wait_s)
        batch = await self.batch.check()
        await self.batch.close()
        sampler.cancel()
        self.sample_memory()
        return self.report(batch)

    # ---- faults ----------------------------------------------------------------------------------------

    async def apply(self, fault: Fault) -> dict:
        waited = time.monotonic()
        whole = await self.wait_whole()
        record = {"fault": fault.kind, "planned_at_s": fault.at_s, "at_s": self.now(), "fleet_whole_before": whole,
                  "waited_for_whole_s": round(time.monotonic() - waited, 1)}
        if fault.kind == "worker_kill":
            record["part"] = self.fleet.kill_one()
        elif fault.kind == "redis_primary_kill":
            record.update(await self.fleet.kill_primary())
        elif fault.kind == "gateway_kill":
            runner = await self.batch_runner()
            g = 1 if runner is None else runner
            self.gateway_kills.append((g, time.monotonic()))
            self.fleet.kill_and_restart(self.fleet.gateways[g])
            record.update(part=self.fleet.gateways[g], ran_the_batch_job=runner is not None)
        elif fault.kind == "worker_cut":
            record.update(await self.cut(self.config.cut_s))
        say(f"chaos: {self.now():.0f}s {record}")
        return record

    async def cut(self, seconds: float) -> dict:
        """Cut the namespaced worker's link for `seconds`; when its heartbeat went, and came back."""
        part, cut = self.fleet.cut_worker, time.monotonic()
        self.link.cut()
        lost = None
        while time.monotonic() - cut < seconds:
            if lost is None and part not in await asyncio.to_thread(self.fleet.beating):
                lost = round(time.monotonic() - cut, 1)
            await asyncio.sleep(0.5)
        self.link.mend()
        mended = time.monotonic()
        back = None
        while back is None and time.monotonic() - mended < WHOLE_WAIT_S:
            if part in await asyncio.to_thread(self.fleet.beating):
                back = round(time.monotonic() - mended, 1)
            await asyncio.sleep(0.5)
        return {"part": part, "mended_at_s": round(mended - self.t0, 1), "heartbeat_gone_after_s": lost,
                "beating_again_after_mend_s": back}

    async def wait_whole(self) -> bool:
        deadline = time.monotonic() + WHOLE_WAIT_S
        while time.monotonic() < deadline:
            if await asyncio.to_thread(self.fleet.whole):
                return True
            await asyncio.sleep(1)
        return False

    async def batch_runner(self) -> int | None:
        """The gateway holding the batch job's lease (by its /healthz id); None if none does."""
        def holder() -> str | None:
            try:
                return self.fleet.redis.get(redis_keys.batch_lease(self.batch.job_id))
            except redis.RedisError:  # a Redis in failover: not known
                return None
        lease = await asyncio.to_thread(holder)
        async with httpx.AsyncClient(timeout=5) as http:
            for g, url in enumerate(self.fleet.http_urls):
                try:
                    if lease and (await http.get(f"{url}/healthz")).json().get("gateway") == lease:
                        return g
                except (httpx.HTTPError, ValueError):
                    continue
        return None

    # ---- memory ----------------------------------------------------------------------------------------

    def sample_memory(self) -> None:
        for part, mb in self.fleet.rss().items():
            self.memory.setdefault(part, []).append((self.now(), mb))

    async def sample_memory_every(self) -> None:
        while True:
            await asyncio.sleep(MEMORY_EVERY_S)
            self.sample_memory()

    def memory_report(self) -> tuple[dict, bool]:
        # The warm-up: a quarter of the run, within 30-60 s. A process is still filling its pools and
        # allocator arenas in its first half minute (a worker on the tiny model grew 486 to 743 MB in
        # a one-minute run measured from 15 s), which is not a leak.
        warm_s = min(60.0, max(30.0, self.config.seconds / 4))
        out, flat = {}, True
        for part, samples in self.memory.items():
            restarts = self.fleet.restarts[part]
            entry = {"start": samples[0][1], "end": samples[-1][1], "restarts": restarts,
                     "every_10s": [[t, mb] for t, mb in samples]}
            warm = next((mb for t, mb in samples if t >= warm_s), None)
            if restarts == 0 and warm is not None and not part.startswith("redis"):
                entry["growth_after_warmup_mb"] = round(samples[-1][1] - warm, 1)
                entry["flat"] = samples[-1][1] - warm <= max(FLAT_MB, FLAT_SHARE * warm)
                flat = flat and entry["flat"]
            out[part] = entry
        return out, flat

    # ---- the report ------------------------------------------------------------------------------------

    def report(self, batch: dict) -> dict:
        ws, sse = self.ws.report(), self.sse.report()
        memory, flat = self.memory_report()
        batch_failed = sum(n for outcome, n in (batch.get("outcomes") or {}).items() if outcome != "ok")
        goal = {
            "failed_except_sse_cut_by_its_gateway": sum(self.ws.failed.values()) + sum(self.sse.failed.values())
            + batch_failed,
            "broken_websocket_streams": self.ws.broken_streams,
            "tokens_duplicated": self.ws.duplicated_tokens + self.sse.duplicated_tokens,
            "tokens_skipped": self.ws.skipped_tokens + self.sse.skipped_tokens,
            "batch_lines_lost_doubled_or_unreadable": None if batch.get("lost") is None
            else batch["lost"] + batch["doubled"] + batch["unreadable"],
            "batch_completed": batch.get("status") == "completed",
            "memory_flat": flat,
        }
        goal["met"] = (goal["failed_except_sse_cut_by_its_gateway"] == 0 and goal["broken_websocket_streams"] == 0
                       and goal["tokens_duplicated"] == 0 and goal["tokens_skipped"] == 0
                       and goal["batch_lines_lost_doubled_or_unreadable"] == 0 and goal["batch_completed"] and flat)
        return {"config": asdict(self.config), "fleet": self.fleet_shape(), "code": code_version(), "goal": goal, "websocket": ws, "sse": sse,
                "batch": batch, "faults": self.faults, "memory_mb": memory,
                "log_events": log_events(self.fleet.workdir),
                "load_s": self.load_s, "wall_s": self.now(), "logs": str(self.fleet.workdir)}

    def fleet_shape(self) -> dict:
        return {"gateways": len(self.fleet.gateways), "workers": len(self.fleet.workers), "reaper": 1,
                "redis": "a primary, 1 replica, 3 sentinels", "cut_worker": self.fleet.cut_worker,
                "cut_by": f"network namespace {self.link.name}: veth {self.link.host_ip} (host) <-> "
                          f"{self.link.ns_ip} (worker), the worker's end set down" if self.link else None}


def code_version() -> dict:
    """The commit the fleet ran, and the tracked files changed from it (a run on work in progress says so)."""
    def git(*args: str) -> str:
        try:
            return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, timeout=10).stdout.strip()
        except OSError:
            return ""
    return {"commit": git("rev-parse", "HEAD") or None,
            "changed_files": git("diff", "--name-only", "HEAD").splitlines()}


def log_events(workdir: Path) -> dict[str, dict[str, int]]:
    """For each event of EVENTS, how many lines of each part's log carry it; and the sentinels'
    SENTINEL_EVENTS (a sentinel in TILT, frozen for over 2 s, fails nothing over for 30 s)."""
    out: dict[str, Counter] = {e: Counter() for e in EVENTS + SENTINEL_EVENTS}
    pattern = re.compile(r"event=(\w+)")
    for log in sorted(workdir.glob("*.log")):
        for match in pattern.finditer(log.read_text(errors="replace")):
            if match.group(1) in out:
                out[match.group(1)][log.stem] += 1
    for log in sorted(workdir.glob("redis-ha/sentinel-*.log")):
        for line in log.read_text(errors="replace").splitlines():
            for event in SENTINEL_EVENTS:
                if f" {event} " in line:
                    out[event][log.stem] += 1
    return {e: dict(c) for e, c in out.items() if c}


def summary(report: dict) -> str:
    """The report in a few lines, for a person."""
    ws, sse, batch, goal = report["websocket"], report["sse"], report["batch"], report["goal"]
    faults = ", ".join(f"{f['fault']}@{f.get('at_s', '-')}s" for f in report["faults"])
    return "\n".join([
        f"chaos: load for {report['load_s']:.0f} s (asked {report['config']['seconds']:.0f}); faults: {faults}",
        f"  websocket: {ws['requests_completed']} completed, failed {ws['requests_failed'] or 0}, "
        f"{ws['broken_streams']} broken, {ws.get('resumed', 0)} resumed; TTFT p50/p99 {ws['ttft_s']['p50']}/"
        f"{ws['ttft_s']['p99']} s, e2e p50/p99 {ws['e2e_s']['p50']}/{ws['e2e_s']['p99']} s",
        f"  sse: {sse['requests_completed']} completed, failed {sse['requests_failed'] or 0}, cut by their gateway's "
        f"kill {sse.get('cut_by_gateway_kill', {})}",
        f"  batch: {batch['status']}, {batch['lines']} lines, lost "
        f"{batch.get('lost', '?')}, doubled {batch.get('doubled', '?')}, unreadable {batch.get('unreadable', '?')}, "
        f"outcomes {batch.get('outcomes')}",
        f"  goal {'met' if goal['met'] else 'NOT met'}: {goal}",
        f"  logs: {report['logs']}"])


def run(config: ChaosConfig) -> dict:
    workdir = Path(tempfile.mkdtemp(prefix="brigade-chaos-"))
    # SIGTERM (a test's timeout, a stopped job) unwinds like Ctrl-C, so the fleet and the link go.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    link = None
    try:
        if config.cut_s > 0:
            try:
                link = CutLink.create()
            except NamespaceUnavailable as exc:
                raise SystemExit(f"the worker cut needs a network namespace ({exc}); run as root, or with "
                                 "--cut-seconds 0 to leave the cut out") from None
        env = {"BRIGADE_MODEL": config.model} if config.model else {}
        env["BRIGADE_CACHE_ENABLED"] = "0"  # every request must reach a worker: the cache would hide faults
        fleet = Fleet(workdir, 2, redis_ha=True, gateways=2, redis_replicas=1, env=env, cut_link=link,
                      worker_prefix="chaos")
        try:
            try:
                fleet.supervisor.wait_for(fleet.whole, 300, interval_s=0.5)
            except (PartExited, TimeoutError) as exc:
                raise SystemExit(f"the fleet did not become ready ({exc}); logs in {workdir}") from None
            report = asyncio.run(Chaos(fleet, link, config).run())
        finally:
            fleet.stop()
        say(summary(report))
        return report
    finally:
        if link is not None:
            link.remove()
