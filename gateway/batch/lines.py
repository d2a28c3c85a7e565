"""One batch line, from its checked request to its result line.

A line goes through the same admission as any request (the answer cache applies), on the batch
lane, charged to the job's key. Refusals that pass (the load, the key's limits, no worker yet) are
waited out and the line is sent again, so a job runs at the pace the system allows; a refusal that
will not pass becomes the line's result, as the HTTP API would have answered it. While Redis is
away (a restart) the line is tried again once it answers. A line a previous runner of the job had
queued is followed through its replay log instead of queued again. Every failure ends as a result
line: a line never leaves a hole that would stall the output.

Identical deterministic lines of a job (temperature 0 or a seed) are answered once
(`IdenticalLines`): a later copy waits for the first and takes its answer.
"""
from __future__ import annotations

import asyncio
import logging
from collections import OrderedDict
from dataclasses import dataclass
from typing import Awaitable, Callable, Generic, TypeVar

import redis.asyncio as aioredis

from gateway.admission.admission import Admission
from gateway.admission.lifecycle import Caller, RequestLifecycle
from gateway.batch.input import BatchLine
from gateway.batch.jobs import JobStore
from gateway.batch.output import LineResult, completed, copy_result, dedup_key, request_failed
from gateway.delivery.events import Done, StreamError, Token
from gateway.delivery.router import AnswerQueue, ReplyRouter
from gateway.doors import openai_render as render
from gateway.request import ProtocolError
from ops.core.redis_clients import async_outage_retry

log = logging.getLogger("brigade.batch")

BATCH_DEDUP_MAX = 10_000
RETRYABLE = {"overloaded", "no_workers", "unavailable", "rate_limited"}

T = TypeVar("T")


@dataclass
class RunningJob:
    """A job as its lines see it while it runs here."""

    id: str
    caller: Caller  # the job's key: its lines are charged to it and held to its limits
    warm_cache: bool  # the lines' answers are stored in the answer cache
    in_flight_ttl_s: int  # how long a line's request id is kept for a runner that continues the job
    # cancelled | expired | lease, once the job stops here. Only a cancel or an expiry stops the
    # job's requests: when the gateway shuts down (or loses the lease) they run on, and the next
    # runner follows them.
    stopping: str | None = None


class IdenticalLines(Generic[T]):
    """The first answer of each distinct deterministic line, awaited by its copies: the last
    `capacity` distinct keys (a key names its job, so jobs never share)."""

    def __init__(self, capacity: int = BATCH_DEDUP_MAX):
        self.capacity = capacity
        self._first: OrderedDict[str, asyncio.Future] = OrderedDict()  # dedup key -> the first line's answer

    async def answer(self, key: str | None, ask: Callable[[], Awaitable[T]]) -> tuple[T, bool]:
        """`ask()`'s answer, or the answer of the first line with this key (True: a copy). A first
        line that fails takes its key with it: the copies waiting raise its error and ask again."""
        if key is None:
            return await ask(), False
        first = self._first.get(key)
        if first is not None:
            self._first.move_to_end(key)
            return await asyncio.shield(first), True
        first = self._first[key] = asyncio.get_running_loop().create_future()
        while len(self._first) > self.capacity:
            self._first.popitem(last=False)
        try:
            result = await ask()
        except BaseException as exc:
            if not first.done():
                self._first.pop(key, None)
                first.set_exception(exc if isinstance(exc, Exception) else RuntimeError("stopped"))
                first.exception()  # retrieved: a copy that never came is no error of its own
            raise
        if not first.done():
            first.set_result(result)
        return result, False


class LineRunner:
    def __init__(self, admission: Admission, lifecycle: RequestLifecycle, router: ReplyRouter, store: JobStore,
                 identical: IdenticalLines[LineResult]):
        self.admission = admission
        self.lifecycle = lifecycle
        self.router = router
        self.store = store
        self.identical = identical

    async def run(self, job: RunningJob, line: BatchLine, known_rid: str | None) -> LineResult:
        """The line's result; `known_rid`: the request a previous runner of the job queued for it."""
        async def redis_away(exc: Exception) -> None:
            # Redis away (a restart): the line is tried again once it answers. If its request
            # was already queued, it may run twice; its line is still written once.
            log.warning("event=batch_line_retry job=%s line=%d error=%r", job.id, line.number, exc)

        retry = async_outage_retry(cap_s=5.0, first_s=0.5, errors=(aioredis.RedisError, OSError))
        try:
            return await retry.call_with_retry(lambda: self._once(job, line, known_rid), redis_away)
        except Exception as exc:  # a bug on one line must not leave a hole that stalls the output
            log.exception("event=batch_line_failed job=%s line=%d", job.id, line.number)
            return request_failed(job.id, line, None, "internal_error", f"the gateway failed on this line: {exc!r}")

    async def _once(self, job: RunningJob, line: BatchLine, known_rid: str | None) -> LineResult:
        result, copied = await self.identical.answer(dedup_key(job.id, line), lambda: self._ask(job, line, known_rid))
        return copy_result(job.id, line, result) if copied else result

    async def _ask(self, job: RunningJob, line: BatchLine, known_rid: str | None) -> LineResult:
        if known_rid is not None:
            sink = AnswerQueue()
            if await self.lifecycle.follow_again(known_rid, line.command.id, sink):
                return await self._collect(job, line, sink, known_rid)
        delay = 0.5
        while True:
            sink = AnswerQueue()
            try:
                admitted = await self.admission.admit(line.command, job.caller, sink, lane="batch",
                                                      store_answer=job.warm_cache)
            except ProtocolError as err:
                if err.code in RETRYABLE:
                    await asyncio.sleep(delay)
                    delay = min(delay * 2, 10.0)
                    continue
                return request_failed(job.id, line, None, err.code, err.message, err.field)
            for event in admitted.cached:
                sink.send(event)
            if admitted.request_id:
                await self.store.record_in_flight(job.id, line.number, admitted.request_id, job.in_flight_ttl_s)
            return await self._collect(job, line, sink, admitted.request_id)

    async def _collect(self, job: RunningJob, line: BatchLine, sink: AnswerQueue, rid: str | None) -> LineResult:
        answer = render.Answer(line.options.n)
        try:
            while True:
                event = await sink.events.get()
                if isinstance(event, Token):
                    answer.add(event)
                elif isinstance(event, Done):
                    return completed(job.id, line, rid, answer, event)
                elif isinstance(event, StreamError):
                    return request_failed(job.id, line, rid, event.code, event.message)
        except asyncio.CancelledError:
            if rid is not None and job.stopping in ("cancelled", "expired"):
                self.lifecycle.abandon(rid, sink)  # the job stopped: so does its request
            elif rid is not None:  # the gateway stops (or lost the lease): the next runner follows it
                self.router.remove(rid, sink)
            raise
