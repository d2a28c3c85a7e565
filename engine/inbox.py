"""The engine's door, where any thread meets the engine thread: requests that arrived since the last
step, cancels not yet taken, and the requests the engine holds (by id).

Any thread puts, cancels and asks whether a request is held; the engine thread takes arrivals and
cancels at the start of a step and says when a request has ended. An arrival moves into the held
table in the same locked step that takes it, so `holds` never misses a request on its way in.
"""
from __future__ import annotations

import threading

from engine.choices import RequestChoices
from engine.engine_request import RequestRejected


class RequestInbox:
    def __init__(self):
        # The requests the engine holds: written on the engine thread (under the lock); reached only
        # through the methods below (`get` on the engine thread, the others under the lock).
        self._held: dict[str, RequestChoices] = {}
        self._arrivals: list[RequestChoices] = []
        # The very groups to stop: a stale cancel must never stop a later run under the same id.
        self._cancels: list[RequestChoices] = []
        # Guards the arrivals, the cancels and which requests are held.
        self._requests_lock = threading.Lock()
        # Rung on every arrival and cancel, and by `ring`: an idle engine thread waits on it.
        self._doorbell = threading.Event()

    # ---- any thread ----------------------------------------------------------------------------

    def put(self, group: RequestChoices) -> None:
        """Queue a request for the next step; raises RequestRejected when its id is already here."""
        with self._requests_lock:
            if group.request_id in self._held or any(g.request_id == group.request_id for g in self._arrivals):
                raise RequestRejected("duplicate_id", f"request {group.request_id!r} is already in the engine")
            self._arrivals.append(group)
        self._doorbell.set()

    def cancel(self, request_id: str) -> None:
        """Ask the next step to stop the request held (or arriving) under this id, if any."""
        with self._requests_lock:
            # The group held now, not the id: a cancel taken after that group ended on its own would
            # stop the next run under its id (a fenced worker that claims its own request again; its
            # new run ended "cancelled" 5 ms after its claim in the chaos bench).
            group = self._held.get(request_id) or next((g for g in self._arrivals if g.request_id == request_id), None)
            if group is not None:
                self._cancels.append(group)
        self._doorbell.set()

    def holds(self, request_id: str) -> bool:
        """Whether the engine still has this request, held or arriving."""
        with self._requests_lock:
            return request_id in self._held or any(g.request_id == request_id for g in self._arrivals)

    def pending(self) -> bool:
        """Whether arrivals or cancels wait for the next step."""
        with self._requests_lock:
            return bool(self._arrivals or self._cancels)

    @property
    def arrivals_waiting(self) -> int:
        """Requests put since the last step (a count for stats: read without the lock)."""
        return len(self._arrivals)

    def ring(self) -> None:
        """Wake an engine thread waiting in `wait`."""
        self._doorbell.set()

    # ---- the engine thread -----------------------------------------------------------------------

    def take(self) -> tuple[list[RequestChoices], list[RequestChoices]]:
        """The arrivals (now held) and the cancels since the last step."""
        with self._requests_lock:
            arrivals, self._arrivals = self._arrivals, []
            cancels, self._cancels = self._cancels, []
            self._held.update((group.request_id, group) for group in arrivals)
        return arrivals, cancels

    def get(self, request_id: str) -> RequestChoices | None:
        """The request held under this id (the engine thread's read: it alone changes the table)."""
        return self._held.get(request_id)

    def ended(self, request_id: str) -> None:
        """The request's last choice ended: the engine holds it no more."""
        with self._requests_lock:
            self._held.pop(request_id, None)

    def wait(self, seconds: float) -> None:
        """Sleep up to `seconds`, or until the doorbell rings."""
        self._doorbell.wait(seconds)
        self._doorbell.clear()
