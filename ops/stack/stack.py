"""A whole Brigade on one machine, as named child processes: the one way `brigade up`, the
benchmarks that start a Brigade of their own (ops/bench/fleet.py, ops/bench/scale.py) and the tests
(tests/services.py) start its parts.

A part is `python -m ops.commands.cli PART ARGS` (`part_command`), run with the stack's environment
and the changes of its own, its output in a log of its own, under one Supervisor
(ops/stack/supervision.py): tied to this process's life, watched, stopped role by role. A Redis the
stack starts itself is `redis_command`'s.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import urllib.request
from collections import Counter
from pathlib import Path
from typing import Callable, Sequence

from ops.stack.supervision import STOP_ORDER, Supervisor

ROOT = Path(__file__).resolve().parents[2]  # the checkout (or the folder the packages are installed in)


def part_command(part: str, *args: str) -> list[str]:
    """The command line of a Brigade part (`gateway`, `worker`, `reaper`, `flower`, `up`, ...)."""
    return [sys.executable, "-m", "ops.commands.cli", part, *args]


def redis_command(server: str, port: int, binds: Sequence[str], folder: Path | None = None, *,
                  persistent: bool = False, protected: bool = True, log: Path | None = None) -> list[str]:
    """redis-server's command line for a stack's own Redis. Never an RDB snapshot; with `persistent`
    an append-only file in `folder`, written to disk every second, so that a restart and a crash lose
    at most the last second and the file alone restores everything. `protected=False` lets clients
    that are not on loopback in (a network namespace's link) without a password."""
    keep = ["--appendonly", "yes", "--appendfsync", "everysec"] if persistent else ["--appendonly", "no"]
    argv = [server, "--port", str(port), "--bind", *binds, "--protected-mode", "yes" if protected else "no",
            "--save", "", *keep]
    if folder is not None:
        argv += ["--dir", str(folder)]
    if log is not None:
        argv += ["--logfile", str(log)]
    return argv


def with_env(env: dict[str, str] | None, changes: dict[str, str | None] | None) -> dict[str, str] | None:
    """`env` (None: this process's own, left to the child) with `changes`; a value None removes."""
    if not changes:
        return env
    out = dict(os.environ if env is None else env)
    for name, value in changes.items():
        if value is None:
            out.pop(name, None)
        else:
            out[name] = value
    return out


def readyz_workers(http_url: str) -> int | None:
    """The live workers a gateway's /readyz counts when it answers 200; None while it does not."""
    try:
        with urllib.request.urlopen(f"{http_url}/readyz", timeout=2) as resp:
            return int(json.loads(resp.read()).get("workers", 0))
    except (OSError, ValueError):
        return None


class Stack:
    """Brigade's parts as named children of this process, each from `part_command`, with `env` (None:
    this process's own environment) and its own changes, and its log `<name>.log` in `logs` (None:
    this process's output). A name started again gets `<name>-2.log`, so that the first one's log
    stays readable; a part restarted by the supervisor (a crash it makes) keeps its log. Parts run
    in `cwd` (None: this process's own, so that `brigade up`'s parts read a relative BRIGADE_MODEL
    as the user wrote it)."""

    def __init__(self, env: dict[str, str] | None = None, logs: Path | None = None, *,
                 order: tuple[str, ...] = STOP_ORDER, grace_s: dict[str, float] | None = None,
                 cwd: Path | None = None):
        self.env, self.logs, self.cwd = env, logs, cwd
        self.supervisor = Supervisor(order=order, grace_s=grace_s)
        self._starts: Counter[str] = Counter()

    def start(self, part: str, name: str | None = None, args: Sequence[str] = (), *,
              env: dict[str, str | None] | None = None, wrap: Callable[[list[str]], list[str]] | None = None,
              death_signal: signal.Signals | None = signal.SIGKILL) -> subprocess.Popen:
        """`brigade PART ARGS` as the part `name` (by default the part's own), stopped with the
        parts of its kind. `wrap`: how to run it elsewhere (a network namespace's `CutLink.command`).
        `death_signal`: what it gets should this process die without stopping it (None: nothing)."""
        name = name or part
        self._starts[name] += 1
        n = self._starts[name]
        log = None if self.logs is None else self.logs / (f"{name}.log" if n == 1 else f"{name}-{n}.log")
        argv = part_command(part, *args)
        return self.supervisor.start(name, wrap(argv) if wrap else argv, env=with_env(self.env, env), cwd=self.cwd,
                                     log=log, death_signal=death_signal, role=part)

    def log(self, name: str) -> Path | None:
        """Where the part started last under `name` writes."""
        out = self.supervisor.parts[name].log
        return Path(out.name) if out is not None else None

    def stop(self) -> None:
        self.supervisor.stop()
