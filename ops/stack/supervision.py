"""One supervisor for Brigade's processes, and what keeps them from outliving it.

`brigade up`, `brigade bench soak` and `brigade bench scale` start Brigade's parts as children,
watch them, and stop them in order (STOP_ORDER) when asked to stop (Ctrl-C, SIGTERM, a closed
terminal, a reader gone from the output) or when one of them exits: a `Supervisor` does all three.
Two things could still leave children running, serving a port with nobody to stop them: the
parent's own death by a signal it cannot catch (SIGKILL, the OOM killer), and an exception from
one of its prints once its output is gone (`brigade up 2>&1 | tee LOG`, then Ctrl-C: the same
SIGINT kills tee, and the next print raised BrokenPipeError before the children were stopped).
Each child therefore asks the kernel for a signal when its parent dies (PR_SET_PDEATHSIG), and
the parent prints through `say`, which never raises.
"""
from __future__ import annotations

import ctypes
import fcntl
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Callable, TextIO

from ops.core.settings import Settings

# Who stops first: the gateway (its clients get a close frame and may resume on another gateway),
# then the workers (they drain: running requests finish or go back to the queue), then the
# reaper and Flower, which watch the workers, then the Redis that all of them use.
STOP_ORDER = ("gateway", "worker", "reaper", "flower", "redis")

# The signals on which `up` stops its children in order and exits 0. SIGHUP: the terminal closed.
# SIGPIPE: whoever read its output is gone (Python ignores SIGPIPE unless told otherwise, and `up`
# would then go on with nobody watching).
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGPIPE)

PR_SET_PDEATHSIG = 1  # linux/prctl.h


def stop_when_signalled() -> Callable[[], bool]:
    """Catch STOP_SIGNALS from here on; the returned function says whether one came. Called from
    the main thread (Python runs signal handlers there), before the first part starts."""
    came: list[int] = []

    def note(signum, _frame) -> None:
        came.append(signum)

    for signum in STOP_SIGNALS:
        signal.signal(signum, note)
    return lambda: bool(came)


def tied_to_this_process(death_signal: signal.Signals) -> Callable[[], None] | None:
    """A Popen preexec_fn: the child receives `death_signal` when this process dies, however it
    dies. None where there is no prctl (not Linux): there, only an orderly stop stops children.

    The kernel sends it when the *thread* that forked the child ends, not the process: children
    must be started from the main thread, which lives as long as the process."""
    if not sys.platform.startswith("linux"):
        return None
    if threading.current_thread() is not threading.main_thread():
        raise RuntimeError("start children from the main thread: PR_SET_PDEATHSIG follows the forking thread")
    prctl = ctypes.CDLL(None, use_errno=True).prctl  # resolved here: the forked child only calls it
    parent = os.getpid()

    def preexec() -> None:
        prctl(PR_SET_PDEATHSIG, int(death_signal), 0, 0, 0)
        # The parent may have died between fork and prctl, and then no signal ever comes.
        if os.getppid() != parent:
            os.kill(os.getpid(), death_signal)

    return preexec


def say(text: str, stream: TextIO | None = None) -> None:
    """print(text) to stream (stderr by default), flushed, for a process whose output may be gone:
    a pipe whose reader died (EPIPE) or a closed terminal (EIO) silences the stream instead of
    raising, so that what `up` does next (stopping its children) still happens."""
    stream = stream or sys.stderr
    try:
        print(text, file=stream, flush=True)
    except OSError:
        _silence(stream)


def _silence(stream: TextIO) -> None:
    # /dev/null in place of the dead file descriptor: later prints, and the flush of what is still
    # buffered when Python exits, go nowhere instead of raising again.
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, stream.fileno())
        os.close(devnull)
    except (OSError, ValueError):
        pass


class FolderInUse(Exception):
    """Another process holds the folder (hold_folder)."""


def hold_folder(folder: Path) -> int:
    """An exclusive lock on `folder`, held until this process ends (the returned descriptor is
    never closed, and children do not inherit it); raises FolderInUse. Two Redis servers writing
    one append-only folder would corrupt it: a second `brigade up` on the same BRIGADE_DATA_DIR
    (on other ports) must refuse to start its own."""
    fd = os.open(folder / ".lock", os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise FolderInUse(folder) from None
    return fd


def stop_processes(processes: list[subprocess.Popen], grace_s: float = 15.0) -> None:
    """SIGTERM them all (workers drain), then wait together; whoever outlives the grace is killed."""
    for p in processes:
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
    deadline = time.time() + grace_s
    for p in processes:
        try:
            p.wait(max(0.1, deadline - time.time()))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def stop_graces(settings: Settings) -> dict[str, float]:
    """How long each role may take to stop once asked, from the settings its processes share."""
    return {"gateway": settings.gateway_shutdown_grace_s + 5, "worker": settings.drain_seconds + 10}


class PartExited(RuntimeError):
    """A supervised process ended while the supervisor waited for something else."""

    def __init__(self, name: str, code: int):
        super().__init__(f"{name} exited (code {code})")
        self.name, self.code = name, code


@dataclass
class Part:
    """One supervised process, and how to start it again."""

    argv: list[str]
    process: subprocess.Popen
    env: dict[str, str] | None
    cwd: Path | None
    log: IO | None
    death_signal: signal.Signals | None  # None: not tied to this process (see Supervisor.start)
    role: str


class Supervisor:
    """Named child processes of this one: started tied to it, watched, stopped in `order`.

    A part's role is given where it starts, or else its name up to the first "-" (`worker-2` stops
    with the workers); every role must be in `order`. Children get their own sessions, so that
    Ctrl-C reaches only this process, which then stops them in order and nothing is left talking to
    a part that is gone. Should this process die without stopping them (SIGKILL), each gets its
    `death_signal` from the kernel.
    Parts are started from the main thread (PR_SET_PDEATHSIG follows the forking thread)."""

    def __init__(self, order: tuple[str, ...] = STOP_ORDER, grace_s: dict[str, float] | None = None,
                 default_grace_s: float = 5.0):
        self.order = order
        self.grace_s = grace_s or {}
        self.default_grace_s = default_grace_s
        self.parts: dict[str, Part] = {}

    @staticmethod
    def role(name: str) -> str:
        return name.split("-")[0]

    def start(self, name: str, argv: list[str], *, env: dict[str, str] | None = None, cwd: Path | None = None,
              log: Path | None = None, death_signal: signal.Signals | None = signal.SIGKILL,
              role: str | None = None) -> subprocess.Popen:
        """Start a part; its output goes to `log` (appended: a part started again keeps one log), else here.
        `death_signal` None: the part is not tied to this process's life (a part started from a thread
        that ends before it should: the tie follows the forking thread)."""
        role = role or self.role(name)
        if role not in self.order:
            raise ValueError(f"part {name!r}: its role {role!r} is not one of {', '.join(self.order)}")
        out = open(log, "a") if log is not None else None
        process = subprocess.Popen(argv, env=env, cwd=cwd, stdout=out, stderr=subprocess.STDOUT if out else None,
                                   start_new_session=True,
                                   preexec_fn=tied_to_this_process(death_signal) if death_signal is not None else None)
        self.parts[name] = Part(argv, process, env, cwd, out, death_signal, role)
        return process

    def process(self, name: str) -> subprocess.Popen:
        return self.parts[name].process

    def kill_and_restart(self, name: str) -> subprocess.Popen:
        """SIGKILL a part (a crash, as `bench soak` makes them) and start it again as it was started."""
        self.parts[name].process.kill()
        return self.restart(name)

    def restart(self, name: str, argv: list[str] | None = None) -> subprocess.Popen:
        """Start a part that ended (or is ending) again, as it was started (or with `argv`)."""
        part = self.parts[name]
        part.process.wait(10)
        if part.log is not None:
            part.log.close()
        log = Path(part.log.name) if part.log is not None else None
        return self.start(name, argv or part.argv, env=part.env, cwd=part.cwd, log=log, death_signal=part.death_signal,
                          role=part.role)

    def exited(self) -> tuple[str, int] | None:
        """The first part found ended, with its exit code; None while all run."""
        for name, part in self.parts.items():
            if part.process.poll() is not None:
                return name, part.process.returncode
        return None

    def wait_for(self, condition: Callable[[], bool], timeout_s: float, stopping: Callable[[], bool] = lambda: False,
                 interval_s: float = 0.2) -> bool:
        """True once `condition()` holds, False if `stopping()` comes first; PartExited when a part
        ends meanwhile, TimeoutError after `timeout_s`."""
        deadline = time.monotonic() + timeout_s
        while not condition():
            if stopping():
                return False
            ended = self.exited()
            if ended is not None:
                raise PartExited(*ended)
            if time.monotonic() > deadline:
                raise TimeoutError(f"not ready in {timeout_s:.0f} s")
            time.sleep(interval_s)
        return True

    def watch(self, stopping: Callable[[], bool], interval_s: float = 0.2) -> tuple[str, int] | None:
        """Until `stopping()` or a part ends: None, or the part that ended and its exit code."""
        while not stopping():
            ended = self.exited()
            if ended is not None:
                return ended
            time.sleep(interval_s)
        return None

    def stop(self, announce: Callable[[str], None] | None = None) -> None:
        """Stop every part, role by role in `order`, each role given its grace."""
        running = [role for role in self.order
                   if any(p.role == role and p.process.poll() is None for p in self.parts.values())]
        if running and announce is not None:
            announce(f"stopping {', then '.join(running)}")
        for role in self.order:
            group = [p.process for p in self.parts.values() if p.role == role]
            if group:
                stop_processes(group, grace_s=self.grace_s.get(role, self.default_grace_s))
        for part in self.parts.values():
            if part.log is not None:
                part.log.close()

    def __enter__(self) -> "Supervisor":
        return self

    def __exit__(self, *exc) -> None:
        self.stop()
