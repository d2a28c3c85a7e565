"""`brigade up` as a user starts it, for the tests that start the whole thing in one command:
`BrigadeUp` (its process, log, readiness and children) and `still_running` (which of a set of
processes outlived it). Nothing here is a mock."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.services import http_status, wait_until


class BrigadeUp:
    """`brigade up ARGS` as a user starts it, configured by `env` (BRIGADE_*), its output in a log
    file unless `stdout` says where. `parts()` names the processes it started."""

    def __init__(self, env: dict, log_path: Path, *args: str, stdout=None, **popen):
        self.env, self.log_path = env, log_path
        self.port = int(env["BRIGADE_GATEWAY_PORT"])
        self._log = open(log_path, "w") if stdout is None else None
        self.proc = subprocess.Popen([sys.executable, "-m", "ops.commands.cli", "up", *args], env=env,
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
