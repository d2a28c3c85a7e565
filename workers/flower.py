"""Flower on the workers' Celery app (`brigade flower`), with an exit that a gone Redis cannot hold up.

Flower inspects workers and re-enables their events from a thread pool, and a thread that finds
Redis gone retries its publish without end (kombu retries a control broadcast forever; no Celery
setting bounds it). Python joins those threads at exit, so a Flower asked to stop while Redis was
down hung until Redis came back (measured: over 40 s, then SIGKILL). Here, once Flower's own
SIGTERM/SIGINT handling has returned, threads still busy get a short grace and the process then
exits without waiting for them: they hold nothing that must be written (Flower runs without
--persistent).

Flower's app is the workers' (their task names, their configuration, ops/core/queue.make_app)
without their transport, so on kombu's own Redis transport: it consumes no tasks, only events and control replies, which are never acked, so the
worker transport's fixes (workers/transport.py) have nothing to do; and Flower picks its broker
client (the Broker page, /api/queues/length) by the scheme of the broker's URL, which a named
transport would replace with its module path.
"""
from __future__ import annotations

import os
import sys
import threading
import time

from ops.core.queue import make_app

app = make_app(include=["workers.tasks"])  # no worker transport: see above

STUCK_THREADS_GRACE_S = 2.0


def main(argv: list[str]) -> None:
    code = 0
    try:
        code = app.start(["flower", *argv]) or 0
    except SystemExit as exc:  # Flower's SIGTERM handler exits through sys.exit
        code = exc.code if isinstance(exc.code, int) else 0
    deadline = time.monotonic() + STUCK_THREADS_GRACE_S
    for t in threading.enumerate():
        if t is not threading.current_thread() and not t.daemon:
            t.join(max(0.0, deadline - time.monotonic()))
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    main(sys.argv[1:])
