"""One process at a time in a build folder: Brigade's kernels (engine/kernels.py) and the peers a
benchmark builds (ops/bench/llama_cpp_build.py).

An `flock` on a lock file, not a file whose existence means "busy": the kernel drops an flock
when its holder dies, however it dies (SIGKILL, an OOM kill, Ctrl-C), so a build killed part-way
never leaves a lock that later processes wait on for ever. The holder writes its pid and command
into the file; a process that waits says so at once, with the holder, and again every `every_s`.
"""
from __future__ import annotations

import fcntl
import os
import sys
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterator


def _holder(handle) -> str:
    handle.seek(0)
    return handle.read().strip() or "unknown"


@contextmanager
def held(lock_file: Path, on_wait: Callable[[str, float], None], every_s: float = 30.0) -> Iterator[float | None]:
    """`lock_file`'s flock for this process; `on_wait(holder, waited_s)` while another holds it.
    Yields how long it waited (None: not at all)."""
    lock_file.parent.mkdir(parents=True, exist_ok=True)
    with open(lock_file, "a+") as handle:
        waited_from = told_at = None
        while True:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                now = time.monotonic()
                waited_from = waited_from or now
                if told_at is None or now - told_at >= every_s:
                    told_at = now
                    on_wait(_holder(handle), now - waited_from)
                time.sleep(0.2)
        handle.seek(0)
        handle.truncate()
        handle.write(f"pid={os.getpid()} command={' '.join(sys.argv)[:200]}")
        handle.flush()
        try:
            yield None if waited_from is None else time.monotonic() - waited_from
        finally:
            handle.seek(0)
            handle.truncate()
            handle.flush()  # the flock goes with the file's close
