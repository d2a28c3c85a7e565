"""`brigade bench soak`: many WebSocket clients for minutes while workers are killed.

It starts its own fleet on free ports (redis-server, the gateway, a reaper and two workers), so
that it may SIGKILL workers: every `kill_every_s` one worker is killed and started again (0: none).
With `redis_primary_kills` N the fleet's Redis is a primary, two replicas and three sentinels
(ops/redis_ha.py) and the primary is SIGKILLed N times, evenly spaced: each time the sentinels
promote a replica, and once they have, the killed node is started again (it rejoins as a replica). Each
client loops over one connection: ask, read to the end, ask again. The report (JSON) counts
requests completed and failed (by error code), checks every answer's indexes for gaps and
repeats, and gives time to first token and the gateway's memory before and after.
"""
from __future__ import annotations

import asyncio
import json
import os
import random
import shutil
import signal
import statistics
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from ops.core.ports import free_port
from ops.core.settings import get_settings
from ops.redis_ha import RedisHA
from ops.supervision import PartExited, Supervisor, stop_graces

QUESTIONS = [
    "What is the capital of France?", "Name three colors.", "Why is the sky blue?", "Give me a tip for sleeping well.",
    "What is 12 times 7?", "Write a haiku about rain.", "Name a famous painter.", "What do bees make?",
    "Translate 'hello' into Spanish.", "What is the largest ocean?", "Suggest a name for a cat.",
    "How many legs does a spider have?",
]


def _rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return round(int(line.split()[1]) / 1024, 1)
    return float("nan")


def _pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    values = sorted(values)
    return round(values[min(len(values) - 1, int(q * len(values)))], 4)


class Fleet:
    """A Brigade of its own on free ports (redis-server, the gateway, a reaper, workers), under one
    Supervisor, so that its workers may be killed and started again."""

    def __init__(self, workdir: Path, workers: int, redis_ha: bool = False):
        self.workdir = workdir
        self.redis_port, self.port = free_port(), free_port()
        server = shutil.which("redis-server")
        if server is None:
            raise SystemExit("redis-server is not installed: sudo apt-get install -y redis-server")
        self.supervisor = Supervisor(grace_s=stop_graces(get_settings()))
        self.ha = RedisHA(workdir / "redis-ha") if redis_ha else None
        if self.ha is not None:
            for name, argv in self.ha.parts(server).items():
                self.supervisor.start(name, argv, death_signal=signal.SIGTERM)
            self.supervisor.wait_for(self.ha.healthy, 60)
            redis_url = self.ha.url
        else:
            self.supervisor.start("redis", [server, "--port", str(self.redis_port), "--save", "", "--appendonly", "no",
                                            "--dir", str(workdir)], log=workdir / "redis.log",
                                  death_signal=signal.SIGTERM)
            redis_url = f"redis://127.0.0.1:{self.redis_port}/0"
        self.env = dict(os.environ, BRIGADE_REDIS_URL=redis_url, BRIGADE_GATEWAY_PORT=str(self.port),
                        BRIGADE_TORCH_THREADS="1", PYTHONUNBUFFERED="1")
        self._start("gateway", "gateway")
        self._start("reaper", "reaper")
        self.workers = [f"worker-{i}" for i in range(workers)]
        for i, part in enumerate(self.workers):
            self._start(part, "worker", "--name", f"soak{i}@bench")
        self.kills = 0

    def _start(self, part: str, *args: str) -> None:
        self.supervisor.start(part, [sys.executable, "-m", "ops.cli", *args], env=self.env,
                              log=self.workdir / f"{part}.log")

    @property
    def gateway_pid(self) -> int:
        return self.supervisor.process("gateway").pid

    def ready(self) -> bool:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/readyz", timeout=2) as r:
                return json.loads(r.read())["workers"] >= len(self.workers)
        except OSError:
            return False

    def kill_one(self) -> str:
        """SIGKILL a worker and start it again (from the main thread: see Supervisor)."""
        part = random.choice(self.workers)
        self.supervisor.kill_and_restart(part)
        self.kills += 1
        return part

    async def kill_primary(self) -> dict:
        """SIGKILL the Redis primary, wait for the sentinels to promote a replica, start the killed
        node again (from the main thread: see Supervisor). Returns what happened, with timings."""
        old = self.ha.primary_port()
        name = self.ha.node_name(old)
        self.supervisor.process(name).kill()
        killed = time.monotonic()
        new = None
        while time.monotonic() - killed < 60:
            await asyncio.sleep(0.1)
            new = self.ha.primary_port()
            if new not in (None, old):
                break
        promoted_s = round(time.monotonic() - killed, 2)
        part = self.supervisor.parts[name]
        self.supervisor.start(name, part.argv, env=part.env, cwd=part.cwd, death_signal=part.death_signal)
        return {"killed": old, "promoted": new, "promoted_after_s": promoted_s}

    def stop(self) -> None:
        self.supervisor.stop()


async def _client(url: str, n: int, until: float, max_tokens: int, stats: dict) -> None:
    from websockets.asyncio.client import connect

    rng = random.Random(n)
    while time.monotonic() < until:
        try:
            async with connect(url, open_timeout=30, max_size=None) as ws:
                while time.monotonic() < until:
                    cid = f"s{n}-{stats['sent']}"
                    stats["sent"] += 1
                    sent = time.monotonic()
                    await ws.send(json.dumps({"type": "generate", "id": cid, "prompt": rng.choice(QUESTIONS),
                                              "max_tokens": max_tokens, "cache": "off"}))
                    indexes, first = [], None
                    while True:
                        event = json.loads(await asyncio.wait_for(ws.recv(), 300))
                        if event.get("id") != cid:
                            continue
                        if event["type"] == "token":
                            first = first or time.monotonic()
                            indexes.append(event["index"])
                        elif event["type"] == "done":
                            stats["completed"] += 1
                            stats["ttft"].append((first or time.monotonic()) - sent)
                            stats["e2e"].append(time.monotonic() - sent)
                            if indexes != list(range(len(indexes))):
                                stats["broken_streams"] += 1
                            break
                        elif event["type"] == "error":
                            stats["failed"][event.get("code", "?")] = stats["failed"].get(event.get("code", "?"), 0) + 1
                            break
        except Exception as exc:  # a connection problem is a failure to report, not a crash of the soak
            key = f"connection:{type(exc).__name__}"
            stats["failed"][key] = stats["failed"].get(key, 0) + 1
            await asyncio.sleep(1)


async def _soak(fleet: Fleet, clients: int, seconds: float, kill_every_s: float, max_tokens: int,
                redis_primary_kills: int = 0) -> dict:
    stats = {"sent": 0, "completed": 0, "failed": {}, "ttft": [], "e2e": [], "broken_streams": 0}
    url = f"ws://127.0.0.1:{fleet.port}/v1/ws"
    rss_before = _rss_mb(fleet.gateway_pid)
    started = time.monotonic()
    until = started + seconds
    tasks = [asyncio.create_task(_client(url, n, until, max_tokens, stats)) for n in range(clients)]
    killed, rss, failovers = [], [], []
    next_kill = started + kill_every_s if kill_every_s > 0 else float("inf")
    # the primary's kills, evenly spaced: for 3 in 300 s, at 75, 150 and 225 s
    primary_kills = [started + seconds * (i + 1) / (redis_primary_kills + 1) for i in range(redis_primary_kills)]
    while time.monotonic() < until:
        await asyncio.sleep(min(2.0, max(0.0, until - time.monotonic())))
        if not rss or time.monotonic() - started - rss[-1][0] >= 10:
            rss.append((round(time.monotonic() - started), _rss_mb(fleet.gateway_pid)))
        if next_kill <= time.monotonic() < until - 5:
            # Not in a thread: a child's death signal follows the thread that started it.
            killed.append(fleet.kill_one())
            next_kill += kill_every_s
        if primary_kills and primary_kills[0] <= time.monotonic():
            primary_kills.pop(0)
            failovers.append(await fleet.kill_primary())
    # Requests in flight at the deadline are finished, not abandoned.
    await asyncio.wait_for(asyncio.gather(*tasks), 600)
    return {
        "clients": clients,
        "seconds": seconds,
        "workers": len(fleet.workers),
        "worker_kills": len(killed),
        "redis_primary_kills": failovers,
        "requests_sent": stats["sent"],
        "requests_completed": stats["completed"],
        "requests_failed": stats["failed"],
        "broken_streams": stats["broken_streams"],
        "ttft_s": {"p50": _pct(stats["ttft"], 0.5), "p99": _pct(stats["ttft"], 0.99)},
        "e2e_s": {"p50": _pct(stats["e2e"], 0.5), "p99": _pct(stats["e2e"], 0.99),
                  "mean": round(statistics.fmean(stats["e2e"]), 4) if stats["e2e"] else None},
        "wall_s": round(time.monotonic() - started, 1),
        "gateway_rss_mb": {"before": rss_before, "after": _rss_mb(fleet.gateway_pid), "every_10s": rss},
        "max_tokens": max_tokens,
    }


def run(clients: int = 200, seconds: float = 120, kill_every_s: float = 30, max_tokens: int = 16,
        workers: int = 2, redis_primary_kills: int = 0) -> dict:
    workdir = Path(tempfile.mkdtemp(prefix="brigade-soak-"))
    fleet = Fleet(workdir, workers, redis_ha=redis_primary_kills > 0)
    try:
        try:
            fleet.supervisor.wait_for(fleet.ready, 180, interval_s=0.5)
        except (PartExited, TimeoutError) as exc:
            raise SystemExit(f"the fleet did not become ready ({exc}); logs in {workdir}") from None
        report = asyncio.run(_soak(fleet, clients, seconds, kill_every_s, max_tokens, redis_primary_kills))
        report["logs"] = str(workdir)
        return report
    finally:
        fleet.stop()
