"""A Brigade of its own on free ports, for the benchmarks that break it (`bench soak`, `bench chaos`).

redis-server (or a primary, replicas and three sentinels: ops/stack/redis_ha.py), gateways, a reaper and
workers, started as one Stack (ops/stack/stack.py), so that any of them may be SIGKILLed and started
again. Parts are
named `gateway-0`, `worker-1`, `redis-primary`, ... One worker may run inside a network namespace
(ops/bench/netns.py): Redis then listens on the namespace link's host address too, and everyone
reaches it there, so that the link can be cut under that worker alone.
"""
from __future__ import annotations

import asyncio
import os
import shutil
import signal
import time
from collections import Counter
from pathlib import Path

import redis

from ops.bench.netns import CutLink
from ops.core import redis_clients
from ops.core.roster import live_workers
from ops.core.ports import free_port
from ops.core.settings import get_settings
from ops.stack.redis_ha import RedisHA, replica_of
from ops.stack.stack import Stack, readyz_workers, redis_command
from ops.stack.supervision import stop_graces


def rss_mb(pid: int) -> float | None:
    """Resident memory of a process in MB; None once it is gone."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return round(int(line.split()[1]) / 1024, 1)
    except OSError:
        pass
    return None


class Fleet:
    """Redis, `gateways` gateways, a reaper and `workers` workers, each a supervised part that may be
    killed and started again (always from the main thread: see Supervisor). `env` is added to every
    Brigade part's environment (a model, a setting). With `cut_link` the last worker runs inside its
    namespace."""

    def __init__(self, workdir: Path, workers: int, redis_ha: bool = False, *, gateways: int = 1,
                 redis_replicas: int = 2, env: dict[str, str] | None = None, cut_link: CutLink | None = None,
                 worker_prefix: str = "soak"):
        self.workdir = workdir
        server = shutil.which("redis-server")
        if server is None:
            raise SystemExit("redis-server is not installed: sudo apt-get install -y redis-server")
        self.stack = Stack(logs=workdir, grace_s=stop_graces(get_settings()))
        self.supervisor = self.stack.supervisor  # Redis and the faults act on its parts
        self.cut_link = cut_link
        self.restarts: Counter[str] = Counter()
        self._redis: redis.Redis | None = None
        self.ha = None
        if redis_ha:
            host, also = (cut_link.host_ip, ("127.0.0.1",)) if cut_link else ("127.0.0.1", ())
            self.ha = RedisHA(workdir / "redis-ha", host=host, also_bind=also,
                              data_ports=[free_port() for _ in range(1 + redis_replicas)])
            self.ha.start(lambda name, argv: self.supervisor.start(name, argv, death_signal=signal.SIGTERM),
                          self.supervisor.wait_for, server)
            redis_url = self.ha.url
        else:
            port, host = free_port(), cut_link.host_ip if cut_link else "127.0.0.1"
            binds = [host, "127.0.0.1"] if cut_link else [host]
            self.supervisor.start("redis", redis_command(server, port, binds, workdir, protected=cut_link is None),
                                  log=workdir / "redis.log", death_signal=signal.SIGTERM)
            redis_url = f"redis://{host}:{port}/0"
        # Every gateway must see the same batch files (docs/batch.md); the bench's own folder.
        self.env = dict(os.environ, BRIGADE_REDIS_URL=redis_url, BRIGADE_TORCH_THREADS="1", PYTHONUNBUFFERED="1",
                        BRIGADE_BATCH_FILES_DIR=str(workdir / "batches"), **(env or {}))
        self.stack.env = self.env
        self.ports = [free_port() for _ in range(gateways)]
        self.gateways = [f"gateway-{i}" for i in range(gateways)]
        for part, port in zip(self.gateways, self.ports):
            self._start(part, ["gateway"], BRIGADE_GATEWAY_PORT=str(port))
        self._start("reaper", ["reaper"])
        self.workers = [f"worker-{i}" for i in range(workers)]
        for i, part in enumerate(self.workers):
            inside = cut_link is not None and i == workers - 1
            self._start(part, ["worker", "--name", f"{worker_prefix}{i}@bench"], inside=inside)
        self.cut_worker = self.workers[-1] if cut_link else None

    def _start(self, name: str, args: list[str], inside: bool = False, **env: str) -> None:
        self.stack.start(args[0], name, args[1:], env=env, wrap=self.cut_link.command if inside else None)

    # ---- where it answers, and whether it is whole -------------------------------------------------

    @property
    def port(self) -> int:
        return self.ports[0]

    @property
    def ws_urls(self) -> list[str]:
        return [f"ws://127.0.0.1:{p}/v1/ws" for p in self.ports]

    @property
    def http_urls(self) -> list[str]:
        return [f"http://127.0.0.1:{p}" for p in self.ports]

    def pid(self, part: str) -> int:
        return self.supervisor.process(part).pid

    def ready(self) -> bool:
        """Every gateway ready and seeing every worker's heartbeat."""
        return all((readyz_workers(url) or 0) >= len(self.workers) for url in self.http_urls)

    @property
    def redis(self) -> redis.Redis:
        """A client of the fleet's Redis (through the sentinels), made on first use."""
        if self._redis is None:
            self._redis = redis_clients.client(self.env["BRIGADE_REDIS_URL"], timeout_s=2, connect_timeout_s=2)
        return self._redis

    def beating(self) -> set[str]:
        """The worker parts whose current process has a live heartbeat (a killed one's heartbeat
        outlives it by the TTL, and a gateway's count of workers cannot tell the two apart)."""
        try:
            pids = {status.get("pid") for status in live_workers(self.redis)}
        except redis.RedisError:
            return set()
        return {w for w in self.workers if self.pid(w) in pids}

    def whole(self) -> bool:
        """Every worker's current process beating, every gateway ready, the Redis set healthy
        (every replica linked, every sentinel agreeing)."""
        return (len(self.beating()) == len(self.workers) and self.ready()
                and (self.ha is None or self.ha.healthy()))

    def rss(self) -> dict[str, float | None]:
        """Every part's resident memory now, MB."""
        return {name: rss_mb(part.process.pid) for name, part in self.supervisor.parts.items()
                if part.process.poll() is None}

    # ---- faults ----------------------------------------------------------------------------------------

    def kill_and_restart(self, part: str) -> None:
        self.supervisor.kill_and_restart(part)
        self.restarts[part] += 1

    def kill_one(self) -> str:
        """SIGKILL the next worker in turn and start it again. In turn, not at random: a run's kills
        land on every worker, so none is left to carry the whole load unkilled (its memory then grows
        with the load, which a run of minutes cannot tell from a leak), and two runs kill alike."""
        part = self.workers[self.kills % len(self.workers)]
        self.kill_and_restart(part)
        return part

    @property
    def kills(self) -> int:
        return sum(n for part, n in self.restarts.items() if part.startswith("worker"))

    async def kill_primary(self) -> dict:
        """SIGKILL the Redis primary, wait for the sentinels to promote a replica, start the killed
        node again. Returns what happened, with timings."""
        old = self.ha.primary_port()
        name = self.ha.node_name(old)
        self.supervisor.process(name).kill()
        killed = time.monotonic()
        new = None
        while time.monotonic() - killed < 60:
            await asyncio.sleep(0.1)
            new = await asyncio.to_thread(self.ha.primary_port)
            if new not in (None, old):
                break
        promoted_s = round(time.monotonic() - killed, 2)
        # A replica of the promoted node at once, or, if none was promoted, for the sentinels to take
        # back as primary (redis_ha.replica_of).
        self.supervisor.restart(name, replica_of(self.supervisor.parts[name].argv, self.ha.host, new))
        self.restarts[name] += 1
        return {"killed": old, "promoted": new if new != old else None, "promoted_after_s": promoted_s}

    def stop(self) -> None:
        self.supervisor.stop()
