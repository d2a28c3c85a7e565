"""The gateway's background work: one set of tasks, waited for briefly and then cancelled at shutdown.

Work a request starts but need not wait for (a cancel sent to the workers, usage recorded, an
answer stored in the cache, the cache's own bookkeeping) is spawned here. Holding a reference
keeps a task from being collected mid-flight (asyncio keeps only weak ones), and holding them all
in one place lets the gateway give them a moment to land when it stops.
"""
from __future__ import annotations

import asyncio
from typing import Coroutine, Iterable


class BackgroundTasks:
    def __init__(self) -> None:
        self._tasks: set[asyncio.Task] = set()

    def spawn(self, coro: Coroutine) -> None:
        self.adopt([asyncio.ensure_future(coro)])

    def adopt(self, tasks: Iterable[asyncio.Task]) -> None:
        """Tasks started elsewhere (the cache's log follower and sweeper), stopped with the rest."""
        for task in tasks:
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def drain(self, timeout_s: float) -> None:
        """Wait up to `timeout_s` for what is still running, then cancel whatever is left."""
        pending = [t for t in self._tasks if not t.done()]
        if pending:
            await asyncio.wait(pending, timeout=timeout_s)
        for task in list(self._tasks):
            task.cancel()
