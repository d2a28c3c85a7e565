"""What keeps `brigade up`'s children from outliving it, and its own output from killing it.

`brigade up` stops its children in order when it is asked to stop (Ctrl-C, SIGTERM, a closed
terminal, a reader gone from its output). Two things could still leave them running, serving a
port with nobody to stop them: its own death by a signal it cannot catch (SIGKILL, the OOM killer),
and an exception from one of its prints once its output is gone (`brigade up 2>&1 | tee LOG`, then
Ctrl-C: the same SIGINT kills tee, and the next print raised BrokenPipeError before the children
were stopped). Each child therefore asks the kernel for a signal when `up` dies (PR_SET_PDEATHSIG),
and `up` prints through `say`, which never raises.
"""
from __future__ import annotations

import ctypes
import fcntl
import os
import signal
import sys
import threading
from pathlib import Path
from typing import Callable, TextIO

# The signals on which `up` stops its children in order and exits 0. SIGHUP: the terminal closed.
# SIGPIPE: whoever read its output is gone (Python ignores SIGPIPE unless told otherwise, and `up`
# would then go on with nobody watching).
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGPIPE)

PR_SET_PDEATHSIG = 1  # linux/prctl.h


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
