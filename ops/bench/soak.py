"""`brigade bench soak`: many WebSocket clients for minutes while workers are killed.

It starts its own fleet on free ports (ops/bench/fleet.py: redis-server, the gateway, a reaper and
two workers), so that it may SIGKILL workers: every `kill_every_s` one worker is killed and started again (0: none).
With `redis_primary_kills` N the fleet's Redis is a primary, two replicas and three sentinels
(ops/stack/redis_ha.py) and the primary is SIGKILLed N times, evenly spaced: each time the sentinels
promote a replica, and once they have, the killed node is started again (it rejoins as a replica). Each
client (ops/bench/load_clients.py) loops over one connection: ask, read to the end, ask again. The
report (JSON) counts requests completed and failed (by error code), checks every answer's indexes
for gaps and repeats, and gives time to first token and the gateway's memory before and after.
`bench chaos` (ops/bench/chaos.py) is the same fleet grown: two gateways, a worker cut from Redis,
SSE clients and a batch job, and every kind of fault in turn.
"""
from __future__ import annotations

import asyncio
import statistics
import tempfile
import time
from pathlib import Path

from ops.bench.fleet import Fleet, rss_mb
from ops.bench.load_clients import Deadline, Tally, websocket_client
from ops.stack.supervision import PartExited


async def _soak(fleet: Fleet, clients: int, seconds: float, kill_every_s: float, max_tokens: int,
                redis_primary_kills: int = 0) -> dict:
    started = time.monotonic()
    tally = Tally(started)
    gateway = fleet.pid("gateway-0")
    rss_before = rss_mb(gateway)
    until = started + seconds
    tasks = [asyncio.create_task(websocket_client(fleet.ws_urls, n, Deadline(until), max_tokens, tally)) for n in range(clients)]
    killed, rss, failovers = [], [], []
    next_kill = started + kill_every_s if kill_every_s > 0 else float("inf")
    # the primary's kills, evenly spaced: for 3 in 300 s, at 75, 150 and 225 s
    primary_kills = [started + seconds * (i + 1) / (redis_primary_kills + 1) for i in range(redis_primary_kills)]
    while time.monotonic() < until:
        await asyncio.sleep(min(2.0, max(0.0, until - time.monotonic())))
        if not rss or time.monotonic() - started - rss[-1][0] >= 10:
            rss.append((round(time.monotonic() - started), rss_mb(gateway)))
        if next_kill <= time.monotonic() < until - 5:
            # Not in a thread: a child's death signal follows the thread that started it.
            killed.append(fleet.kill_one())
            next_kill += kill_every_s
        if primary_kills and primary_kills[0] <= time.monotonic():
            primary_kills.pop(0)
            failovers.append(await fleet.kill_primary())
    # Requests in flight at the deadline are finished, not abandoned.
    await asyncio.wait_for(asyncio.gather(*tasks), 600)
    seen = tally.report()
    return {
        "clients": clients,
        "seconds": seconds,
        "workers": len(fleet.workers),
        "worker_kills": len(killed),
        "redis_primary_kills": failovers,
        "requests_sent": seen["requests_sent"],
        "requests_completed": seen["requests_completed"],
        "requests_failed": seen["requests_failed"],
        "broken_streams": seen["broken_streams"],
        "tokens_duplicated": seen["tokens_duplicated"],
        "tokens_skipped": seen["tokens_skipped"],
        "ttft_s": seen["ttft_s"],
        "e2e_s": {**seen["e2e_s"], "mean": round(statistics.fmean(tally.e2e), 4) if tally.e2e else None},
        "wall_s": round(time.monotonic() - started, 1),
        "gateway_rss_mb": {"before": rss_before, "after": rss_mb(gateway), "every_10s": rss},
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
