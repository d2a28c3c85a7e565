"""Real services for the tests: a redis-server on a free port, `brigade worker` and
`brigade gateway` processes. Nothing here is a mock."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
import redis

from ops.core.ports import free_port  # noqa: F401  (the tests take it from here)

REDIS_INSTALL_HINT = (
    "redis-server is not installed, and the integration tests need a real one: "
    "run `make test` (it installs it) or `sudo apt-get install -y redis-server`"
)


def wait_until(predicate, timeout: float, interval: float = 0.1, what: str = "condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


class RedisServer:
    """A real redis-server on a free port. `persistent` keeps an append-only file, so that a
    restart brings the data back as a production Redis would."""

    def __init__(self, tmp: Path, persistent: bool = False):
        self.binary = shutil.which("redis-server")
        if self.binary is None:
            pytest.fail(REDIS_INSTALL_HINT, pytrace=False)
        self.port = free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.args = [self.binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
                     "--appendonly", "yes" if persistent else "no", "--dir", str(tmp)]
        self.client = redis.Redis.from_url(self.url, decode_responses=True)
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


class BrigadeProcess:
    """`python -m ops.cli <part>` with the given environment, its output in a log file."""

    def __init__(self, part: str, env: dict, log_path: Path, extra: list[str] | None = None):
        self.log_path = log_path
        self.log = open(log_path, "w")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "ops.cli", part, *(extra or [])],
            env=env, stdout=self.log, stderr=subprocess.STDOUT, cwd=Path(__file__).resolve().parent.parent,
        )

    def tail(self, n: int = 40) -> str:
        lines = self.log_path.read_text(errors="replace").splitlines()
        return "\n".join(lines[-n:])

    def stop(self, timeout: float = 20) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        self.log.close()


def service_env(redis_url: str, gateway_port: int, **extra: str | None) -> dict:
    """The environment of a test service; a variable given as None is removed."""
    env = dict(os.environ)
    env.update({
        "BRIGADE_REDIS_URL": redis_url,
        "BRIGADE_GATEWAY_PORT": str(gateway_port),
        "PYTHONUNBUFFERED": "1",
        # Test stacks answer greedily unless a request says otherwise, so that answers compare
        # token for token and are cached; the default model samples at 0.2. The tests of the
        # defaults themselves pass BRIGADE_DEFAULT_TEMPERATURE=None.
        "BRIGADE_DEFAULT_TEMPERATURE": "0",
    })
    for name, value in extra.items():
        if value is None:
            env.pop(name, None)
        else:
            env[name] = value
    return env


def http_get(port: int, path: str) -> tuple[int, dict]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())


def worker_statuses(client: redis.Redis) -> list[dict]:
    from ops.core import fleet

    return fleet.live_workers(client)


def http_status(port: int, path: str) -> int | None:
    """The status of GET path, or None while nothing answers on the port."""
    try:
        return http_get(port, path)[0]
    except OSError:
        return None


def create_key(redis_url: str, name: str = "test", **limits) -> str:
    """A real API key in the test's Redis (gateway/api_keys.py), as `brigade keys create` makes one."""
    import asyncio

    import redis.asyncio as aioredis

    from gateway.api_keys import KeyStore

    async def create() -> str:
        client = aioredis.Redis.from_url(redis_url)
        try:
            return (await KeyStore(client).create(f"{name}-{time.monotonic_ns()}", **limits))[0]
        finally:
            await client.aclose()

    return asyncio.run(create())


class BrigadeUp:
    """`brigade up ARGS` as a user starts it, configured by `env` (BRIGADE_*), its output in a log
    file unless `stdout` says where. `parts()` names the processes it started."""

    def __init__(self, env: dict, log_path: Path, *args: str, stdout=None, **popen):
        self.env, self.log_path = env, log_path
        self.port = int(env["BRIGADE_GATEWAY_PORT"])
        self._log = open(log_path, "w") if stdout is None else None
        self.proc = subprocess.Popen([sys.executable, "-m", "ops.cli", "up", *args], env=env,
                                     cwd=Path(__file__).resolve().parent.parent, stdout=self._log or stdout,
                                     stderr=subprocess.STDOUT, **popen)

    def wait_ready(self, timeout: float = 300) -> dict:
        """Wait until /readyz is 200 (a worker holds its model); returns parts()."""
        def ready() -> bool:
            if self.proc.poll() is not None:
                raise AssertionError(f"brigade up exited ({self.proc.returncode}):\n{self.tail()}")
            return http_status(self.port, "/readyz") == 200
        wait_until(ready, timeout, interval=0.3, what="`brigade up` to turn ready")
        return self.parts()

    def parts(self) -> dict:
        """Its children (psutil.Process) by part: gateway, worker, reaper, redis, flower."""
        import psutil

        named = {"brigade-gateway": "gateway", "brigade-worker": "worker", "brigade-reaper": "reaper",
                 "redis-server": "redis"}
        found = {}
        for child in psutil.Process(self.proc.pid).children():
            name = named.get(child.name()) or ("flower" if "workers.flower" in child.cmdline() else child.name())
            found[name] = child
        return found

    def tail(self, n: int = 40) -> str:
        lines = self.log_path.read_text(errors="replace").splitlines() if self.log_path.exists() else []
        return "\n".join(lines[-n:])

    def kill(self) -> None:
        """Teardown: SIGKILL `up` and whatever it started that still runs."""
        import psutil

        try:
            started = psutil.Process(self.proc.pid).children()
        except psutil.NoSuchProcess:
            started = []
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)
        for p in still_running(started):
            p.kill()
        if self._log is not None:
            self._log.close()


def still_running(processes: list) -> list:
    """The psutil processes that still run (an exited process not yet reaped, a zombie, does not)."""
    import psutil

    running = []
    for p in processes:
        try:
            if p.is_running() and p.status() != psutil.STATUS_ZOMBIE:
                running.append(p)
        except psutil.NoSuchProcess:
            pass
    return running
