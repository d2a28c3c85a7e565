"""A Redis that survives its own failure, on one machine: a primary, two replicas, three sentinels.

For trying Brigade's failover where it runs (`brigade up --redis-ha`), for the chaos tests and for
`brigade bench soak --kill-redis-primary`. Production runs each node on its own machine; the
processes and their settings are the same (docker-compose.yml's `redis-ha` profile).

Settings, and why (Redis's own Sentinel and replication documentation is the reference):
- three sentinels with a quorum of two: one sentinel's mistaken view of the primary is not a failover,
  and a failover needs a majority to authorise it;
- `down-after-milliseconds` 1000 (the default is 30 s): on one machine a primary that does not answer
  for a second is dead, and every second here is a second of every stream stalling;
- every data node keeps an append-only file, fsynced every second, so a node restarted after a
  crash comes back with its data, as a replica of the new primary (`replica_of`);
- `repl-diskless-sync-delay` 0 (the default is 5 s): a replica that (re)joins is sent the data at
  once, not after five seconds spent waiting for others to join the same transfer; here at most
  two replicas ever join, and until one has the data the set has no replica to fail over to;
- `replica-serve-stale-data yes` (the default) and no `min-replicas-to-write`: Brigade asks for the
  writes whose loss matters to be confirmed with WAIT (workers/claims.py), instead of refusing every
  write while a replica is away;
- with `tls` (`TLSFiles`), every node and sentinel speaks only TLS, replication and the sentinels'
  own links too, and asks each client for a certificate signed by the same CA (redis-server's
  default): the set a managed Redis with TLS is, for tests/test_redis_tls.py.
"""
from __future__ import annotations

import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import redis

from ops.core import redis_clients
from ops.core.ports import free_port
from ops.core.redis_address import sentinel_url, with_tls_defaults

MASTER_NAME = "brigade"
QUORUM = 2
DOWN_AFTER_MS = 1000
FAILOVER_TIMEOUT_MS = 5000
INSTALL_HINT = "redis-server (which also runs the sentinels) is not installed: sudo apt-get install -y redis-server"


@dataclass(frozen=True)
class TLSFiles:
    """One side's files of a TLS link: its certificate and key, and the CA that signed them, against
    which it checks the other side's certificate. A Redis that speaks only TLS checks its clients'
    too; its replicas and sentinels present the same certificate, and so do the set's own clients here."""

    ca_file: Path
    cert_file: Path
    key_file: Path

    def server_args(self, port: int) -> list[str]:
        """redis-server's (and a sentinel's) arguments for TLS on `port` and nothing in the clear;
        they go after the others, whose `--port` they override (the last one given wins)."""
        return ["--port", "0", "--tls-port", str(port), "--tls-cert-file", str(self.cert_file),
                "--tls-key-file", str(self.key_file), "--tls-ca-cert-file", str(self.ca_file),
                "--tls-replication", "yes"]

    def client_options(self) -> dict[str, str]:
        """redis-py's TLS options (a URL's ssl_* query) for a client of such a Redis."""
        return {"ssl_ca_certs": str(self.ca_file), "ssl_certfile": str(self.cert_file),
                "ssl_keyfile": str(self.key_file)}


@dataclass
class RedisHA:
    """The ports and folders of one local primary + replicas + sentinels, and their command lines."""

    folder: Path
    host: str = "127.0.0.1"
    data_ports: list[int] = field(default_factory=lambda: [free_port() for _ in range(3)])
    sentinel_ports: list[int] = field(default_factory=lambda: [free_port() for _ in range(3)])
    master: str = MASTER_NAME
    password: str | None = None
    # Addresses to listen on besides `host`, the one the sentinels announce: with `host` on a link
    # the chaos bench made (ops/bench/netns.py), loopback too.
    also_bind: tuple[str, ...] = ()
    tls: TLSFiles | None = None  # every node and sentinel on TLS alone

    @property
    def addresses(self) -> list[str]:
        return [self.host, *self.also_bind]

    @property
    def protected_mode(self) -> str:
        """"no" where it must be: without a password, Redis refuses clients on any address but
        loopback, and a bench's own link is reachable only from this host."""
        return "yes" if self.password or all(a.startswith("127.") for a in self.addresses) else "no"

    @property
    def url(self) -> str:
        return sentinel_url([(self.host, p) for p in self.sentinel_ports], self.master, 0, self.password,
                            tls=self.tls.client_options() if self.tls else None)

    def node_url(self, port: int) -> str:
        auth = f":{self.password}@" if self.password else ""
        return self._url(f"{auth}{self.host}:{port}/0")

    def _url(self, address: str) -> str:
        if self.tls is None:
            return f"redis://{address}"
        return with_tls_defaults(f"rediss://{address}", self.tls.client_options())

    def parts(self, server: str | None = None) -> dict[str, list[str]]:
        """Name -> argv: `redis-primary`, `redis-replica1`, `redis-replica2`, `redis-sentinel1..3`.
        The first data node starts as primary; which one is primary later is the sentinels' word."""
        server = server or shutil.which("redis-server")
        if server is None:
            raise FileNotFoundError(INSTALL_HINT)
        self.folder.mkdir(parents=True, exist_ok=True)
        primary = self.data_ports[0]
        out: dict[str, list[str]] = {}
        for i, port in enumerate(self.data_ports):
            data = self.folder / f"node-{port}"
            data.mkdir(exist_ok=True)
            argv = [server, "--port", str(port), "--bind", *self.addresses, "--protected-mode", self.protected_mode,
                    "--save", "", "--appendonly", "yes",
                    "--appendfsync", "everysec", "--repl-diskless-sync-delay", "0",
                    "--dir", str(data), "--logfile", str(data / "redis.log")]
            if self.password:
                # replicas authenticate to whichever node is primary: every node has the same password
                argv += ["--requirepass", self.password, "--masterauth", self.password]
            if i:
                argv += ["--replicaof", self.host, str(primary)]
            if self.tls:
                argv += self.tls.server_args(port)
            out["redis-primary" if i == 0 else f"redis-replica{i}"] = argv
        for i, port in enumerate(self.sentinel_ports, 1):
            conf = self.folder / f"sentinel-{port}.conf"
            if not conf.exists():  # a sentinel rewrites its file with what it learned; a restart keeps it
                lines = [f"port {port}", f"bind {' '.join(self.addresses)}", f"protected-mode {self.protected_mode}",
                         f"dir {self.folder}",
                         f"logfile {self.folder / f'sentinel-{port}.log'}",
                         f"sentinel monitor {self.master} {self.host} {primary} {QUORUM}",
                         f"sentinel down-after-milliseconds {self.master} {DOWN_AFTER_MS}",
                         f"sentinel failover-timeout {self.master} {FAILOVER_TIMEOUT_MS}",
                         f"sentinel parallel-syncs {self.master} 1"]
                if self.password:
                    lines.append(f"sentinel auth-pass {self.master} {self.password}")
                conf.write_text("\n".join(lines) + "\n")
            tls = self.tls.server_args(port) if self.tls else []
            out[f"redis-sentinel{i}"] = [server, str(conf), "--sentinel", *tls]
        return out

    # ---- asking the running set -------------------------------------------------------------------

    def _sentinel(self, port: int) -> redis.Redis:
        return redis_clients.client(self._url(f"{self.host}:{port}"), timeout_s=1, connect_timeout_s=1)

    def primary_port(self) -> int | None:
        """The primary's port as the sentinels name it (the first that answers); None if none does."""
        for port in self.sentinel_ports:
            try:
                found = self._sentinel(port).sentinel_get_master_addr_by_name(self.master)
            except redis.RedisError:
                continue
            if found:
                return int(found[1])
        return None

    def node_name(self, port: int) -> str:
        """The part name of the data node on this port (as in `parts`)."""
        i = self.data_ports.index(port)
        return "redis-primary" if i == 0 else f"redis-replica{i}"

    def start(self, launch: Callable[[str, list[str]], object], wait: Callable[[Callable[[], bool], float], bool],
              server: str | None = None, timeout_s: float = 60.0) -> bool:
        """Start the set through `launch(name, argv)` (a supervisor's start): the data nodes, and once
        every replica is linked, the sentinels, whose first look at the primary then finds the whole
        set (started with the data nodes, they found the replicas only at their next look, 10 s later).
        `wait(condition, timeout_s)` waits out each stage; False when it gave up."""
        parts = self.parts(server)
        data = {name: argv for name, argv in parts.items() if not name.startswith("redis-sentinel")}
        sentinels = {name: argv for name, argv in parts.items() if name not in data}
        for stage, ready in ((data, self.replicas_linked), (sentinels, self.healthy)):
            for name, argv in stage.items():
                launch(name, argv)
            if not wait(ready, timeout_s):
                return False
        return True

    def _node(self, port: int) -> redis.Redis:
        return redis_clients.client(self.node_url(port), timeout_s=1, connect_timeout_s=1)

    def _primary_of_all(self, node: redis.Redis) -> bool:
        """This node is a primary with every replica online (what its `INFO replication` says)."""
        info = node.info("replication")
        online = sum(1 for k, v in info.items() if k.startswith("slave") and isinstance(v, dict) and v.get("state") == "online")
        return info.get("role") == "master" and online >= len(self.data_ports) - 1

    def replicas_linked(self) -> bool:
        """The first data node, primary at the start, has every replica online."""
        try:
            return self._primary_of_all(self._node(self.data_ports[0]))
        except redis.RedisError:
            return False

    def healthy(self) -> bool:
        """Every sentinel sees the primary, its two replicas linked, and the other two sentinels;
        the primary answers writes. A set that is not healthy yet cannot fail over cleanly."""
        port = self.primary_port()
        if port is None:
            return False
        try:
            for s in self.sentinel_ports:
                state = self._sentinel(s).sentinel_master(self.master)
                if (state["ip"] != self.host or int(state["port"]) != port
                        or int(state["num-slaves"]) < len(self.data_ports) - 1
                        or int(state["num-other-sentinels"]) < len(self.sentinel_ports) - 1):
                    return False
            node = self._node(port)
            return self._primary_of_all(node) and bool(node.set("brigade:ha:probe", "1", ex=10))
        except (redis.RedisError, KeyError, ValueError):
            return False

    def wait_healthy(self, timeout_s: float = 60.0) -> None:
        deadline = time.monotonic() + timeout_s
        while not self.healthy():
            if time.monotonic() > deadline:
                raise TimeoutError(f"the Redis HA set in {self.folder} was not healthy after {timeout_s:.0f}s "
                                   f"(logs: {self.folder})")
            time.sleep(0.2)


def replica_of(argv: list[str], host: str, primary: int | None) -> list[str]:
    """A killed data node's argv (`RedisHA.parts`) to start it again: a replica of `primary`, the
    node the sentinels promoted, at once; left to them, it comes back as a primary of its own until
    their next INFO look at it (every 10 s) tells them to turn it. With no other primary (None, or
    this node's own port: no failover happened) it starts without `--replicaof`, for the sentinels
    to take back as primary (as a replica of the node it replaced, a node whose failover never
    happened replicated the other, which replicated it: no primary at all)."""
    if "--replicaof" in argv:
        at = argv.index("--replicaof")
        argv = argv[:at] + argv[at + 3:]
    own = int(argv[argv.index("--port") + 1])
    return argv if primary in (None, own) else [*argv, "--replicaof", host, str(primary)]
