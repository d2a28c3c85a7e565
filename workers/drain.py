"""The graceful drain (SIGTERM): take no more work, let the running requests finish for a while,
then hand the rest back with their progress, so that no task outlives the drain's time and no
client loses what it was sent (the next worker continues from the replay log)."""
from __future__ import annotations

import logging
import time

from engine import Engine
from workers.handover import Handover
from workers.held import HeldRequests

log = logging.getLogger("brigade.worker")

# How often a drain looks whether every held request has ended.
POLL_S = 0.05


class Drain:
    def __init__(self, held: HeldRequests, engine: Engine, handover: Handover):
        self.held = held
        self.engine = engine
        self.handover = handover

    def run(self, seconds: float) -> None:
        """Runs on its own thread (tasks.py starts it), beside the task threads it ends."""
        self.held.close()  # from now on a task thread that claims a request hands it straight back
        log.info("event=draining running=%d seconds=%.1f", len(self.held), seconds)
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline and len(self.held):
            time.sleep(POLL_S)
        rest = self.held.take_all()
        for entry in rest:
            self.engine.cancel(entry.queued.request_id)
            self.handover.hand_back(entry)
            entry.finish_reason = "handed_back"
            entry.finished.set()
        log.info("event=drained handed_back=%d", len(rest))
