# Over 400 lines: every real service a test starts (Redis, an HA set, workers, gateways, the Stack), so no test module starts its own.
"""Real services for the tests: a redis-server on a free port, `brigade worker` and
`brigade gateway` processes, and `Stack`, the one way a test module starts them together, waits
for them, breaks them and stops them (`brigade up` itself: tests/brigade_up.py). Its processes are
parts of the same ops Stack as `brigade up`'s and the benchmarks' (ops/stack/stack.py), and its
Redis has their command line. Nothing here is a mock."""
from __future__ import annotations

import asyncio
import inspect
import json
import os
import shutil
import signal
import subprocess
import threading
import time
import urllib.error
import urllib.request
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Callable, Iterator

import pytest
import redis

from ops.core.ports import free_port  # noqa: F401  (the tests take it from here)
from ops.stack.redis_ha import TLSFiles, replica_of
from ops.stack.stack import Stack as Parts
from ops.stack.stack import redis_command, with_env

ROOT = Path(__file__).resolve().parent.parent  # where every test part runs, as a developer would
REDIS_INSTALL_HINT = (
    "redis-server is not installed, and the integration tests need a real one: "
    "run `make test` (it installs it) or `sudo apt-get install -y redis-server`"
)


def wait_until(predicate, timeout: float, interval: float = 0.1, what: str = "condition"):
    """Poll `predicate` until it returns something true, and return that; fail after `timeout` s."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


async def wait_until_async(predicate, timeout: float, interval: float = 0.05, what: str = "condition"):
    """wait_until inside an event loop: it polls without blocking the loop, so that the loop's
    tasks (a cache following another's log) run meanwhile; `predicate` may return an awaitable."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if inspect.isawaitable(value):
            value = await value
        if value:
            return value
        await asyncio.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


def issue_certificates(folder: Path) -> tuple[TLSFiles, TLSFiles]:
    """A CA made here and two certificates it signed, each for 127.0.0.1 and localhost: a server's
    and a client's (real openssl, EC keys: a few milliseconds each)."""
    openssl = shutil.which("openssl")
    if openssl is None:
        pytest.fail("openssl is not installed, and the TLS tests make their certificates with it: "
                    "sudo apt-get install -y openssl", pytrace=False)
    folder.mkdir(parents=True, exist_ok=True)
    ca, ca_key = folder / "ca.crt", folder / "ca.key"
    new_key = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]

    def run(*args: str) -> None:
        subprocess.run([openssl, *args], check=True, capture_output=True)

    run("req", "-x509", *new_key, "-keyout", str(ca_key), "-out", str(ca), "-days", "2", "-subj", "/CN=Brigade test CA")
    names = folder / "names.cnf"
    names.write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\n")
    issued = []
    for who in ("server", "client"):
        cert, key, request = folder / f"{who}.crt", folder / f"{who}.key", folder / f"{who}.csr"
        run("req", *new_key, "-keyout", str(key), "-out", str(request), "-subj", f"/CN=brigade-test-{who}")
        run("x509", "-req", "-in", str(request), "-CA", str(ca), "-CAkey", str(ca_key), "-CAcreateserial",
            "-out", str(cert), "-days", "2", "-extfile", str(names))
        issued.append(TLSFiles(ca_file=ca, cert_file=cert, key_file=key))
    return issued[0], issued[1]


class RedisServer:
    """A real redis-server on a free port. `persistent` keeps an append-only file, so that a
    restart brings the data back as a production Redis would. With `tls` it speaks only TLS and
    asks every client for a certificate (`url` is rediss://; `client` presents the server's own)."""

    def __init__(self, tmp: Path, persistent: bool = False, tls: TLSFiles | None = None,
                 also_bind: tuple[str, ...] = ()):
        self.binary = shutil.which("redis-server")
        if self.binary is None:
            pytest.fail(REDIS_INSTALL_HINT, pytrace=False)
        self.port = free_port()
        self.url = f"{'rediss' if tls else 'redis'}://127.0.0.1:{self.port}/0"
        # `also_bind`: the host's end of network namespaces' links, for parts started inside them.
        # Clients from a namespace's link are not loopback: Redis's protected mode would refuse them.
        self.args = redis_command(self.binary, self.port, ("127.0.0.1", *also_bind), tmp, persistent=persistent,
                                  protected=not also_bind) + (tls.server_args(self.port) if tls else [])
        self.client = redis.Redis.from_url(self.url, decode_responses=True, **(tls.client_options() if tls else {}))
        self.start()

    def start(self) -> None:
        self.proc = subprocess.Popen(self.args, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
        wait_until(self._answers, 10, what="redis-server to answer")

    def _answers(self) -> bool:
        try:
            return bool(self.client.ping())
        except redis.ConnectionError:
            return False

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(10)


class RedisHAServer:
    """A real primary, `replicas` replicas (two by default) and three sentinels (ops/stack/redis_ha.py) on
    free ports, seen by a Stack as its Redis: `url` is the redis+sentinel:// URL every Brigade
    process gets, `client` follows the primary through failovers. `kill_primary` is the fault: SIGKILL of whichever node
    the sentinels name primary. With `tls` every node and sentinel speaks only TLS, and `url` is
    rediss+sentinel:// with the CA and a certificate in its query."""

    def __init__(self, tmp: Path, replicas: int = 2, tls: TLSFiles | None = None):
        from ops.core.redis_clients import client
        from ops.stack.redis_ha import RedisHA

        if shutil.which("redis-server") is None:
            pytest.fail(REDIS_INSTALL_HINT, pytrace=False)
        self.ha = RedisHA(tmp, data_ports=[free_port() for _ in range(1 + replicas)], tls=tls)
        self.procs: dict[str, subprocess.Popen] = {}

        def launch(name: str, argv: list[str]) -> None:
            self.procs[name] = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)

        self.ha.start(launch, lambda ready, timeout_s: wait_until(ready, timeout_s, interval=0.05,
                                                                   what=f"the Redis HA set in {tmp} to come up"))
        self.url = self.ha.url
        self.client = client(self.url)

    def kill_primary(self) -> str:
        """SIGKILL the primary; returns its part name (to start it again)."""
        port = self.ha.primary_port()
        assert port is not None, "no sentinel names a primary"
        name = self.ha.node_name(port)
        self.procs[name].kill()
        self.procs[name].wait(10)
        return name

    def restart(self, name: str) -> None:
        """Start a killed node again, as a replica of the primary the sentinels promoted (as the
        benchmark fleet does, ops/bench/fleet.py): left to the sentinels, it came back as a primary
        of its own until their next look at it, 10-15 s, which every following test waited out."""
        self.procs[name] = subprocess.Popen(replica_of(self.ha.parts()[name], self.ha.host, self.ha.primary_port()),
                                            stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)

    def stop(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.terminate()
        for proc in self.procs.values():
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()


class BrigadeProcess:
    """One Brigade part a test's Stack started (ops/stack/stack.py: `python -m ops.commands.cli <part>`),
    with the environment it runs with and its log file."""

    def __init__(self, proc: subprocess.Popen, env: dict, log_path: Path, log: IO):
        self.proc, self.env, self.log_path, self.log = proc, env, log_path, log
        self._asked = False

    @property
    def port(self) -> int:
        """The gateway port its environment names (a gateway's own; a worker's is unused)."""
        return int(self.env["BRIGADE_GATEWAY_PORT"])

    @property
    def ws_url(self) -> str:
        return f"ws://127.0.0.1:{self.port}/v1/ws"

    @property
    def http_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def tail(self, n: int = 40) -> str:
        lines = self.log_path.read_text(errors="replace").splitlines()
        return "\n".join(lines[-n:])

    def ask_to_stop(self) -> None:
        """SIGTERM, once (a second one makes uvicorn skip its graceful shutdown)."""
        if self.proc.poll() is None and not self._asked:
            self.proc.terminate()
            self._asked = True

    def stop(self, timeout: float = 20) -> None:
        if self.proc.poll() is None:
            self.ask_to_stop()
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        self.log.close()


def queued_params(**given):
    """A request's params as a gateway queues them: every sampling field filled (greedy, unless
    given), for a test that puts a request on the queue itself."""
    from ops.core.messages import GenerateParams

    return GenerateParams(**{"max_tokens": 16, "temperature": 0.0, "top_p": 1.0, "top_k": 0,
                             "repetition_penalty": 1.0, **given})


def service_env(redis_url: str, gateway_port: int, **extra: str | None) -> dict:
    """The environment of a test service; a variable given as None is removed."""
    base = {
        "BRIGADE_REDIS_URL": redis_url,
        "BRIGADE_GATEWAY_PORT": str(gateway_port),
        "PYTHONUNBUFFERED": "1",
        # Test stacks answer greedily unless a request says otherwise, so that answers compare
        # token for token and are cached; the default model samples at 0.2. The tests of the
        # defaults themselves pass BRIGADE_DEFAULT_TEMPERATURE=None.
        "BRIGADE_DEFAULT_TEMPERATURE": "0",
        # The mechanics run on the tiny random model, whose answers go round in loops within a few
        # tokens, and need long ones (a fault must land mid-answer): no answer is cut for looping.
        # The cut is tested on its own (tests/test_repetition.py).
        "BRIGADE_REPETITION_STOP_TOKENS": "0",
        # One thread per worker: the two pytest processes and their stacks share two cores, and a
        # worker of two threads beside them is oversubscribed (FACTS: ruinous for OpenMP). The
        # answers do not depend on it (each product's sum runs within one thread).
        "BRIGADE_TORCH_THREADS": "1",
    }
    return with_env(dict(os.environ), {**base, **extra})


def http_get(port: int, path: str) -> tuple[int, dict]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())


def worker_statuses(client: redis.Redis) -> list[dict]:
    from ops.core import roster

    return roster.live_workers(client)


def http_status(port: int, path: str) -> int | None:
    """The status of GET path, or None while nothing answers on the port."""
    try:
        return http_get(port, path)[0]
    except OSError:
        return None


def create_key(redis_url: str, name: str = "test", **limits) -> str:
    """A real API key in the test's Redis (gateway/admission/api_keys.py), as `brigade keys create` makes one."""
    from gateway.admission.api_keys import KeyStore
    from ops.core.redis_clients import async_client

    async def create() -> str:
        client = async_client(redis_url)  # the one factory: a redis+sentinel:// URL too
        try:
            return (await KeyStore(client).create(f"{name}-{time.monotonic_ns()}", **limits))[0]
        finally:
            await client.aclose()

    return asyncio.run(create())


class Stack:
    """Real Brigade processes on one Redis: gateways, workers and the rest (reapers, Flower), each
    logging to its own file in `logs`, all from one environment (`service_env` with `env`'s
    changes; a process may change it further). As a context manager it prints every log's tail if
    its block fails (a fixture's start) and stops every process at the end, and the Redis too when
    the stack owns it (`own_redis`: a module that restarts Redis, or keeps it append-only)."""

    def __init__(self, redis: RedisServer, logs: Path, *, own_redis: bool = False, **env: str | None):
        self.redis, self.logs, self.own_redis = redis, logs, own_redis
        self.port = free_port()  # the gateway named "gateway"; any other gateway gets a port of its own
        self.env = service_env(redis.url, self.port, **env)
        # Every process is a part of one ops Stack, as `brigade up`'s and the benchmarks' are; this
        # class stops them itself (all asked at once: see `stop`).
        self.parts = Parts(self.env, logs, cwd=ROOT)
        self.gateways: dict[str, BrigadeProcess] = {}
        self.workers: dict[str, BrigadeProcess] = {}
        self.started: list[BrigadeProcess] = []  # every process, in start order, replaced ones too

    def __enter__(self) -> "Stack":
        return self

    def __exit__(self, kind, error, trace) -> None:
        try:
            if kind is not None:
                print(self.tails())
        finally:
            self.stop()

    @property
    def gateway(self) -> BrigadeProcess:
        return self.gateways["gateway"]

    @property
    def url(self) -> str:
        """The WebSocket of the gateway named "gateway"."""
        return f"ws://127.0.0.1:{self.port}/v1/ws"

    @property
    def http(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    # ---- starting ------------------------------------------------------------------------------

    def start(self, part: str, name: str | None = None, extra: list[str] | None = None,
              wrap: Callable[[list[str]], list[str]] | None = None, **env: str | None) -> BrigadeProcess:
        """`brigade <part>` in the stack's environment with `env`'s changes; its log is `<name>.log`,
        and a name started again (a replacement) gets `<name>-2.log`, so that the first one's log
        stays readable. `wrap`: how to run it elsewhere (a network namespace's `CutLink.command`)."""
        return self._launch(part, name or part, env, extra, wrap)

    def start_gateway(self, name: str = "gateway", wrap: Callable[[list[str]], list[str]] | None = None,
                      **env: str | None) -> BrigadeProcess:
        port = self.port if name == "gateway" else free_port()
        self.gateways[name] = self.start("gateway", name, wrap=wrap, BRIGADE_GATEWAY_PORT=str(port), **env)
        return self.gateways[name]

    def start_worker(self, name: str, wrap: Callable[[list[str]], list[str]] | None = None,
                     **env: str | None) -> BrigadeProcess:
        """A worker under this --name; one already started under it is replaced in `workers`."""
        self.workers[name] = self.start("worker", name, ["--name", name], wrap=wrap, **env)
        return self.workers[name]

    def _launch(self, part: str, name: str, env: dict[str, str | None], extra: list[str] | None,
                wrap: Callable[[list[str]], list[str]] | None = None) -> BrigadeProcess:
        # Tied to this process's life (killed should pytest die) when started from the main thread; a
        # part a test's thread starts is not, as the tie would follow that thread and kill the part
        # as soon as the thread ends.
        tied = signal.SIGKILL if threading.current_thread() is threading.main_thread() else None
        proc = self.parts.start(part, name, extra or [], env=env, wrap=wrap, death_signal=tied)
        started = self.parts.supervisor.parts[name]
        proc = BrigadeProcess(proc, started.env or self.env, self.parts.log(name), started.log)
        self.started.append(proc)
        return proc

    # ---- waiting -------------------------------------------------------------------------------

    def statuses(self, names=None) -> dict[str, dict]:
        """The heartbeats of the live workers started under these names (all by default), only
        the current process's under each name (not a killed predecessor's, not yet expired)."""
        names = list(self.workers if names is None else names)
        return {s["worker"]: s for s in worker_statuses(self.redis.client)
                if s["worker"] in names and s["pid"] == self.workers[s["worker"]].proc.pid}

    def claimant(self, request_id: str) -> dict | None:
        """The heartbeat of the worker whose claim this request is: the claim is written when the
        worker takes it, so it is known before the worker's next beat lists the request."""
        from ops.core import redis_keys

        owner = self.redis.client.hget(redis_keys.CLAIMS, request_id)
        owner = owner.decode() if isinstance(owner, bytes) else owner
        return next((s for s in worker_statuses(self.redis.client) if owner and s.get("instance") == owner), None)

    def wait_ready(self, workers=None, gateways=None, timeout: float = 300) -> dict[str, dict]:
        """Wait until these workers (all by default) beat and these gateways (all by default)
        answer /readyz with 200; fails at once, with its log, if one of them has exited. Returns
        the workers' heartbeats."""
        workers = list(self.workers if workers is None else workers)
        gateways = list(self.gateways if gateways is None else gateways)
        found: dict[str, dict] = {}

        def ready() -> bool:
            self._assert_running([self.workers[n] for n in workers] + [self.gateways[g] for g in gateways])
            found.clear()
            found.update(self.statuses(workers))
            return (len(found) == len(workers)
                    and all(http_status(self.gateways[g].port, "/readyz") == 200 for g in gateways))

        wait_until(ready, timeout, interval=0.2, what=f"workers {workers} to beat and gateways {gateways} to be ready")
        return found

    def wait_healthy(self, gateways=None, timeout: float = 180) -> None:
        """Wait until these gateways (all by default) answer /healthz with 200, ready or not."""
        gateways = list(self.gateways if gateways is None else gateways)

        def healthy() -> bool:
            self._assert_running([self.gateways[g] for g in gateways])
            return all(http_status(self.gateways[g].port, "/healthz") == 200 for g in gateways)

        wait_until(healthy, timeout, interval=0.2, what=f"gateways {gateways} to answer /healthz")

    @staticmethod
    def _assert_running(processes: list[BrigadeProcess]) -> None:
        for p in processes:
            if p.proc.poll() is not None:
                raise AssertionError(f"{p.log_path.name} exited ({p.proc.returncode}):\n{p.tail()}")

    # ---- faults and restarts -------------------------------------------------------------------

    def kill(self, process: BrigadeProcess, sig: int = signal.SIGKILL, timeout: float = 10) -> int:
        """Send `sig` and wait for the process to exit; returns its exit code."""
        os.kill(process.proc.pid, sig)
        code = process.proc.wait(timeout)
        process.stop()  # closes its log
        return code

    def restart_gateway(self, name: str = "gateway", timeout: float = 180) -> BrigadeProcess:
        """Stop the gateway (if it still runs) and start another on its port with its environment
        (a deploy, or a crash and a restart); returns once the new one is ready."""
        old = self.gateways[name]
        old.stop()
        self.gateways[name] = self._launch("gateway", name, old.env, None)  # its every variable, as it ran
        self.wait_ready(workers=[], gateways=[name], timeout=timeout)
        return self.gateways[name]

    @contextmanager
    def another_gateway(self, name: str, timeout: float = 180, **env: str | None) -> Iterator[BrigadeProcess]:
        """A gateway beside the stack's for one test, ready; stopped and forgotten at the end."""
        proc = self.start_gateway(name, **env)
        try:
            self.wait_ready(workers=[], gateways=[name], timeout=timeout)
            yield proc
        finally:
            proc.stop()
            del self.gateways[name]

    @contextmanager
    def frozen_worker(self, name: str, worker_name: str, **env: str | None) -> Iterator[BrigadeProcess]:
        """A worker (`--name worker_name`, its log `<name>.log`, not one of `workers`) stopped with
        SIGSTOP once it beats and once no BRPOP of its own is pending (one sent before it stopped
        would still take the next message): it looks live while it takes nothing. At the end it is
        SIGKILLed and its heartbeat forgotten."""
        import psutil

        from ops.core import roster

        worker = self.start("worker", name, ["--name", worker_name], **env)
        client = self.redis.client
        status = wait_until(lambda: next((s for s in worker_statuses(client) if s["worker"] == worker_name), None),
                            120, what=f"{worker_name}'s first heartbeat")
        worker.proc.send_signal(signal.SIGSTOP)
        ports = {c.laddr.port for c in psutil.Process(worker.proc.pid).net_connections(kind="tcp") if c.raddr}

        def none_blocked() -> bool:
            return not any(int(c["addr"].rsplit(":", 1)[1]) in ports and "b" in c["flags"] for c in client.client_list())

        wait_until(none_blocked, 30, what=f"{worker_name}'s last BRPOP to time out")
        try:
            yield worker
        finally:
            worker.proc.kill()
            worker.proc.wait(10)
            roster.forget(client, status["instance"])

    # ---- the end -------------------------------------------------------------------------------

    def tails(self, n: int = 60) -> str:
        """The end of every log, without the access lines of wait_ready's /readyz polls."""
        parts = []
        for p in self.started:
            lines = [x for x in p.log_path.read_text(errors="replace").splitlines() if "HTTP response sent" not in x]
            parts.append(f"--- {p.log_path.name}\n" + "\n".join(lines[-n:]))
        return "\n".join(parts)

    def stop(self) -> None:
        """Stop every process, then the Redis the stack owns. All are asked at once, the last
        started first, and then waited for: one by one, each worker's drain and each gateway's
        shutdown added up to 10-17 s of a module's teardown."""
        for p in reversed(self.started):
            p.ask_to_stop()
        for p in reversed(self.started):
            p.stop()
        if self.own_redis:
            self.redis.stop()


def _process_tree(pid: int) -> list[int]:
    """A process and all its descendants (from /proc's children lists)."""
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        for task in Path(f"/proc/{p}/task").glob("*"):
            try:
                todo += [int(c) for c in (task / "children").read_text().split()]
            except OSError:
                continue
    return out
