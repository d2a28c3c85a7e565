"""The reply router: which waiting client gets a worker's event, and in what shape. No sockets, no Redis.

A route maps a server request id to a sink (a WebSocket connection, an HTTP response) and the
client's own id. Live routes are fed by this gateway's pub/sub channel; followed routes (a
client that resumed, on any gateway) by the request's replay log. For each event the router
decides once, for every door: drop it (stale epoch, an index already forwarded, no route),
report a gap (the replay log has what pub/sub lost), or deliver it as a client event, ending
the route on `done` or `error`.
"""
from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Any, Protocol

from gateway.delivery.events import ClientEvent, Done, StreamError, Token
from ops.core.messages import ReplyEvent


class Sink(Protocol):
    """Where a route's client events go (typed: each door renders them its own way). A sink that
    needs neither notice below subclasses this and keeps them as the no-ops they are here."""

    def send(self, event: ClientEvent) -> None: ...

    def queued(self, client_id: str, request_id: str) -> None:
        """The request is on the queue: called before any of its events reaches this sink."""

    def ended(self, client_id: str) -> None:
        """The request's last event was sent (or it was stopped): this sink no longer waits for it."""


class AnswerQueue(Sink):
    """The sink of one answer its door reads in order (an HTTP response, a batch line): its
    events wait in a queue for that reader."""

    def __init__(self) -> None:
        self.events: asyncio.Queue[ClientEvent] = asyncio.Queue()

    def send(self, event: ClientEvent) -> None:
        self.events.put_nowait(event)


@dataclass
class Route:
    request_id: str
    client_id: str
    sink: Sink
    next_index: int = 0
    epoch: int = 0  # the newest claim epoch seen; older events are stale
    since: float = field(default_factory=time.time)  # when this sink took the request on
    stream_id: str = "0-0"  # the last replay-log entry read (followed routes; live ones after a gap)
    keep_text: bool = False  # the answer is needed at the end (cache, output guards)
    chunks: list[str] = field(default_factory=list)  # with keep_text: the answer's pieces, in order
    catching_up: bool = False  # a gap is being filled from the replay log: live events wait for it
    # Deliveries that came before the request was confirmed queued (a list), sent right after
    # its `queued`; None once confirmed.
    held: list | None = None
    # Set once admission is done storing the request (on the queue, or failed and removed); until
    # then its record may not be in Redis *yet*, which a catch-up must not read as lost. None: the
    # request was stored before this route was made (a resume, a follow).
    stored: asyncio.Event | None = None
    # The request as admission stored it (a QueuedRequest): sent again when Redis lost it before it
    # ran (a failover that lost the primary's last writes). None: this gateway never held it.
    queued: Any = None
    # What admission knows of the request (cache query, caller, guard input): settled at the end.
    context: Any = None
    model: str = ""  # the model and version it runs on, named in its `done` event
    version: str = ""

    @property
    def text(self) -> str:
        return "".join(self.chunks)


@dataclass(frozen=True)
class Delivery:
    route: Route
    event: ClientEvent
    reply: ReplyEvent  # the worker's event it came from
    ended: bool = False


GAP = object()  # accept(): a token arrived ahead of the next index; catch up from the replay log


class ReplyRouter:
    def __init__(self) -> None:
        self.live: dict[str, Route] = {}
        self.followed: dict[str, Route] = {}

    def add(self, route: Route, followed: bool = False) -> None:
        (self.followed if followed else self.live)[route.request_id] = route

    def get(self, rid: str, sink: Sink | None = None) -> Route | None:
        for table in (self.live, self.followed):
            route = table.get(rid)
            if route is not None and (sink is None or route.sink is sink):
                return route
        return None

    def remove(self, rid: str, sink: Sink | None = None) -> Route | None:
        """Stop routing a request (to `sink` only, when given: another connection may follow it too)."""
        for table in (self.live, self.followed):
            route = table.get(rid)
            if route is not None and (sink is None or route.sink is sink):
                del table[rid]
                return route
        return None

    def accept(self, event: ReplyEvent) -> Delivery | object | None:
        """A live event from pub/sub: a delivery, GAP, or None (nobody waits for it, or already sent)."""
        route = self.live.get(event.request_id)
        if route is None:
            return None  # cancelled, or its client left
        if route.catching_up or (event.type == "token" and event.index is not None and event.index > route.next_index):
            # Everything, a `done` included, waits for the catch-up: the log holds it, in order.
            route.catching_up = True
            return GAP
        return self.forward(route, event)

    def forward(self, route: Route, event: ReplyEvent) -> Delivery | None:
        """One worker event for one route, unless stale or already sent; ends the route on done/error."""
        if event.epoch is not None:
            if event.epoch < route.epoch:
                return None  # from a worker whose claim was taken over
            route.epoch = event.epoch
        if event.type == "token":
            if event.index is None:
                return None
            if route.keep_text and event.index == len(route.chunks):
                # Kept even when already sent (a resumed route reads the log from the start), so
                # the output guards and the cache see the whole answer, not what followed a resume.
                route.chunks.append(event.text or "")
            if event.index < route.next_index:
                return None  # already forwarded
            route.next_index = event.index + 1
            return Delivery(route, Token(route.client_id, event.index, event.text or "", event.choice,
                                         event.logprobs, event.prompt_logprobs, event.finish_reason, event.usage),
                            event)
        if not self._end(route):
            return None  # already ended (a duplicate done, or a catch-up racing the live event)
        if event.type == "done":
            client_event: ClientEvent = Done(route.client_id, event.finish_reason or "stop", event.usage,
                                             event.timing, route.model, route.version, event.finish_reasons,
                                             prompt_logprobs=event.prompt_logprobs)
        else:
            client_event = StreamError(route.client_id, event.code or "error", event.message or "")
        return Delivery(route, client_event, event, ended=True)

    def _end(self, route: Route) -> bool:
        for table in (self.live, self.followed):
            if table.get(route.request_id) is route:
                del table[route.request_id]
                return True
        return False

    def routes(self) -> list[Route]:
        return [*self.live.values(), *self.followed.values()]
