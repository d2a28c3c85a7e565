"""The requests this worker holds: each claimed request's InFlight, from the moment a task thread
registers it until it ends, is handed back or is fenced, and the drain flag that closes
registration.

One lock guards both, so that a drain that begins can never miss a request a task thread is
registering at that moment: the drain sets the flag under it, and a task thread registers only
under it after reading the flag. Threads that take it: Celery task threads (register, forget),
the engine thread (each step's updates), the cancel listener (is this request ours?), the
heartbeat (the ids it reports) and the drain. Nothing is called while it is held.
"""
from __future__ import annotations

import threading

from engine import SequenceUpdate
from workers.inflight import InFlight


class HeldRequests:
    def __init__(self) -> None:
        self._held: dict[str, InFlight] = {}  # request id -> its InFlight
        self._draining = False
        # Guards _held and _draining (the threads that take it: the module's docstring). Taken
        # inside the publisher's lock when a publish finds a request fenced, never the other way.
        self._held_lock = threading.Lock()

    def register(self, entry: InFlight) -> bool:
        """Hold the request, unless a drain has begun (False: the caller hands it back)."""
        with self._held_lock:
            if self._draining:
                return False
            self._held[entry.queued.request_id] = entry
            return True

    def forget(self, rid: str) -> InFlight | None:
        """The request is no longer ours to report on (refused, fenced, ended without the engine)."""
        with self._held_lock:
            return self._held.pop(rid, None)

    def __contains__(self, rid: str) -> bool:
        with self._held_lock:
            return rid in self._held

    def __len__(self) -> int:
        return len(self._held)  # a count for a log line or a drain's wait: one read, no lock needed

    def ids(self) -> list[str]:
        with self._held_lock:
            return sorted(self._held)

    def epochs(self, rids: set[str]) -> dict[str, int]:
        """Our claims' epochs of those of `rids` we hold."""
        with self._held_lock:
            return {rid: self._held[rid].epoch for rid in rids if rid in self._held}

    def match(self, updates: list[SequenceUpdate]) -> list[tuple[InFlight, SequenceUpdate]]:
        """One engine step's updates paired with the requests they are about; updates of requests we
        no longer hold (cancelled, fenced, handed back) are dropped, and a request whose update ends
        it is held no more."""
        mine = []
        with self._held_lock:
            for u in updates:
                entry = self._held.get(u.request_id)
                if entry is None:
                    continue
                if u.finish_reason is not None:
                    del self._held[u.request_id]
                mine.append((entry, u))
        return mine

    # ---- the drain ---------------------------------------------------------------------------------

    def close(self) -> None:
        """Register nothing more: a drain has begun."""
        with self._held_lock:
            self._draining = True

    @property
    def draining(self) -> bool:
        return self._draining

    def take_all(self) -> list[InFlight]:
        """Every request still held, which this worker lets go of."""
        with self._held_lock:
            rest = list(self._held.values())
            self._held.clear()
        return rest
