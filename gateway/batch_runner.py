"""Runs batch jobs inside the gateways: whichever gateway holds a job's lease runs it.

Every gateway looks for active jobs once a `batch_poll_s` and takes the lease of any job nobody
holds (a short TTL it renews), so a job outlives the gateway that started it: when that gateway
stops or dies, the lease lapses and another gateway (or the same one, restarted) continues.

Running a job: validate every line first (all bad lines reported at once); then stream the input,
keeping a window of lines in flight through the same admission as any request (the answer cache
applies) on the batch lane, and write the output in input order. The window is the live workers'
batch width (`max_batch` each) shared among the jobs this gateway runs, unless `batch_window`
sets it: enough to fill every engine row, while each worker's other task threads (it takes
`worker_concurrency`, twice its batch width, off the queue) stay free for interactive requests,
which would otherwise wait on the queue for a batch line to end before a worker took them. Results that come
back early wait in a reorder buffer no larger than the window; written results are fsynced, then
the job records how far it got (lines written, bytes of output) and forgets their request ids.
A job continued after a crash truncates the output to the recorded length, follows the requests
still in flight through their replay logs (each was queued once), and queues the rest: each
custom_id is written exactly once even when its request ran twice.

Identical deterministic lines of a job (temperature 0 or a seed) are answered once: a later copy
waits for the first and takes its answer (within the last BATCH_DEDUP_MAX distinct ones).
"""
from __future__ import annotations

import asyncio
import itertools
import json
import logging
import os
import time
from collections import OrderedDict
from dataclasses import dataclass, field

import redis.asyncio as aioredis

from gateway import metrics
from gateway import openai_render as render
from gateway.admission import Admission
from gateway.api_keys import ApiKey, KeyStore
from gateway.batch_input import BadLine, BatchLine, Checker, MAX_REASONS_SHOWN, check_file
from gateway.batch_jobs import JobStore, new_id
from gateway.batch_output import BLANK, LineResult, copy_result, dedup_key, invalid_result, output_line, request_failed
from gateway.lifecycle import Caller, RequestLifecycle
from gateway.load import LoadMonitor
from gateway.protocol import ClientProtocol, ProtocolError
from gateway.router import AnswerQueue, ReplyRouter
from ops.core import keys
from ops.core.redis_clients import async_client, async_outage_retry
from ops.core.settings import Settings

log = logging.getLogger("brigade.batch")

BATCH_DEDUP_MAX = 10_000
RETRYABLE = {"overloaded", "no_workers", "unavailable", "rate_limited"}
FLUSH_EVERY_S = 0.5


@dataclass
class JobRun:
    """One runner's pass over one job: the open output, the window and the reorder buffer."""

    job: dict
    output: object  # the output file, open for binary writing
    written: int
    completed: int
    failed: int
    output_tokens: int
    caller: Caller = field(default_factory=lambda: Caller(None, "batch"))
    pending: dict[int, asyncio.Task] = field(default_factory=dict)
    done: dict[int, LineResult] = field(default_factory=dict)
    flushed_at: float = 0.0
    checked_at: float = 0.0
    # cancelled | expired | lease, once the job stops here. Only a cancel or an expiry stops the
    # job's requests: when the gateway shuts down (or loses the lease) they run on, and the next
    # runner follows them.
    stopping: str | None = None

    @property
    def id(self) -> str:
        return self.job["id"]


class LeaseLost(Exception):
    pass


class BatchRunner:
    def __init__(self, settings: Settings, protocol: ClientProtocol, admission: Admission, lifecycle: RequestLifecycle,
                 router: ReplyRouter, load: LoadMonitor, key_store: KeyStore, holder: str):
        self.settings = settings
        self.protocol = protocol
        self.admission = admission
        self.lifecycle = lifecycle
        self.router = router
        self.load = load
        self.key_store = key_store
        self.redis = async_client(self.settings.redis_url)
        self.store = JobStore(self.redis, self.settings)
        self.holder = holder  # this gateway's id, on the leases it takes
        self.running: dict[str, asyncio.Task] = {}
        self._answers: OrderedDict[str, asyncio.Future] = OrderedDict()  # dedup key -> the first line's result

    # ---- finding work -----------------------------------------------------------------------------

    async def run(self) -> None:
        while True:
            try:
                for job_id in await self.store.active():
                    if job_id not in self.running and await self.store.take_lease(job_id, self.holder):
                        self.running[job_id] = asyncio.ensure_future(self._run(job_id))
            except aioredis.RedisError as exc:
                log.warning("event=batch_poll_failed error=%r", exc)
            await asyncio.sleep(self.settings.batch_poll_s)

    async def close(self) -> None:
        for task in list(self.running.values()):
            task.cancel()
        await asyncio.gather(*self.running.values(), return_exceptions=True)
        await self.redis.aclose()

    async def _run(self, job_id: str) -> None:
        lost = asyncio.Event()
        keeper = asyncio.ensure_future(self._keep_lease(job_id, lost))
        try:
            job = await self.store.get(job_id)
            if job is None:  # expired
                await self.redis.srem(keys.BATCH_ACTIVE, job_id)
                return
            log.info("event=batch_job_taken job=%s state=%s written=%d", job_id, job["state"], job["written"])
            if job["state"] == "validating":
                await self._validate(job)
                job = await self.store.get(job_id)
            if job["state"] in ("in_progress", "cancelling"):
                await self._execute(job, lost)
                job = await self.store.get(job_id)
            if job["state"] == "finalizing":
                await self._finalize(job)
        except LeaseLost:
            log.warning("event=batch_lease_lost job=%s", job_id)
        except asyncio.CancelledError:
            raise
        except Exception:  # the job stays active: the next poll (here or elsewhere) continues it
            log.exception("event=batch_job_failed job=%s", job_id)
            await asyncio.sleep(self.settings.batch_poll_s)
        finally:
            keeper.cancel()
            self.running.pop(job_id, None)
            try:
                await self.store.drop_lease(job_id, self.holder)
            except aioredis.RedisError:
                pass

    async def _keep_lease(self, job_id: str, lost: asyncio.Event) -> None:
        while True:
            await asyncio.sleep(self.settings.batch_lease_s / 3)
            try:
                if not await self.store.renew_lease(job_id, self.holder):
                    lost.set()
                    return
            except aioredis.RedisError as exc:
                log.warning("event=batch_lease_renew_failed job=%s error=%r", job_id, exc)

    def window(self) -> int:
        if self.settings.batch_window:
            return self.settings.batch_window
        workers = max(self.load.workers, 1)
        return max(1, workers * self.settings.max_batch // max(len(self.running), 1))

    async def _owner_key(self, job: dict) -> ApiKey | None:
        """The API key that submitted the job: its lines are charged to it and held to its limits
        (a line refused for a limit waits and is sent again, so a job runs at its key's pace)."""
        if not job.get("owner"):
            return None
        key = await self.key_store.get(job["owner"])
        return None if key is None or key.revoked else key

    def checker(self) -> Checker:
        return Checker(self.protocol)

    # ---- validating --------------------------------------------------------------------------------

    async def _validate(self, job: dict) -> None:
        record = await self.store.get_file(job["input_file_id"])
        if record is None:
            await self._fail(job, [{"code": "input_missing", "message": "the input file is gone (expired?)",
                                    "line": None}])
            return
        valid, bad, count_bad = await asyncio.to_thread(check_file, record["path"], self.checker())
        if bad and not job["skip_invalid"]:
            await self.store.update(job["id"], invalid=count_bad)
            await self._fail(job, bad)
            return
        if valid == 0:
            await self._fail(job, bad or [{"code": "empty_input", "message": "the input has no request lines",
                                           "line": None}])
            return
        await self.store.update(job["id"], total=valid, invalid=count_bad, errors=bad,
                                output_file_id=new_id("file"))
        await self.store.move(job["id"], "in_progress")
        log.info("event=batch_validated job=%s lines=%d invalid=%d", job["id"], valid, count_bad)

    async def _fail(self, job: dict, errors: list[dict]) -> None:
        await self.store.update(job["id"], errors=errors[:MAX_REASONS_SHOWN])
        await self.store.move(job["id"], "failed")
        log.info("event=batch_failed job=%s errors=%d", job["id"], len(errors))

    # ---- running -------------------------------------------------------------------------------------

    async def _execute(self, job: dict, lost: asyncio.Event) -> None:
        record = await self.store.get_file(job["input_file_id"])
        if record is None:
            await self._fail(job, [{"code": "input_missing", "message": "the input file is gone (expired?)",
                                    "line": None}])
            return
        path = self.store.path_for(job["output_file_id"])
        output = open(path, "r+b" if path.exists() else "w+b")
        output.truncate(job["output_offset"])  # anything past it was written by a runner that died
        output.seek(job["output_offset"])
        run = JobRun(job, output, job["written"], job["completed"], job["failed"], job["output_tokens"],
                     Caller(await self._owner_key(job), "batch"))
        known = await self.store.in_flight(job["id"])
        checker = self.checker()
        stopping: str | None = None
        try:
            with open(record["path"], "rb") as source:
                for number, raw in enumerate(source, start=1):
                    # Every line is checked, those written before too: a custom_id repeated later
                    # must still read as a repeat when a continued pass starts past the first one.
                    result = checker.check(number, raw)
                    if number <= run.written:
                        continue
                    stopping = stopping or await self._should_stop(run, lost)
                    if stopping:
                        break
                    if result is None:
                        run.done[number] = BLANK
                    elif isinstance(result, BadLine):
                        run.done[number] = invalid_result(run.id, result)
                    else:
                        while len(run.pending) >= self.window() and not stopping:
                            await self._wait_some(run)
                            stopping = await self._should_stop(run, lost)
                        if stopping:
                            break
                        run.pending[number] = asyncio.ensure_future(self._line(run, result, known.get(number)))
                    await self._harvest(run)
            while run.pending and not stopping:
                await self._wait_some(run)
                stopping = await self._should_stop(run, lost)
            if stopping:
                run.stopping = stopping
                await self._stop_pending(run)
            if stopping != "lease":  # without the lease, the output is another runner's now
                await self._harvest(run, force=True, skip_gaps=bool(stopping))
        finally:
            output.close()
            if run.pending:  # left by an error (Redis away) or a shutdown: the next pass follows them
                run.stopping = run.stopping or "lease"
                for task in run.pending.values():
                    task.cancel()
        if stopping == "lease":
            raise LeaseLost()
        if stopping in ("cancelled", "expired"):
            await self.store.move(run.id, stopping)
            await self._record_output(run.job, "batch_output")
            log.info("event=batch_%s job=%s written=%d", stopping, run.id, run.written)
            return
        await self.store.move(run.id, "finalizing")

    async def _should_stop(self, run: JobRun, lost: asyncio.Event) -> str | None:
        if lost.is_set():
            return "lease"
        now = time.monotonic()
        if now - run.checked_at < 0.5:
            return None
        run.checked_at = now
        job = await self.store.get(run.id)
        if job is None or job.get("cancel_requested"):
            return "cancelled"
        if time.time() > job["expires_at"]:
            return "expired"
        return None

    async def _wait_some(self, run: JobRun) -> None:
        await asyncio.wait(list(run.pending.values()), timeout=0.5, return_when=asyncio.FIRST_COMPLETED)
        await self._harvest(run)

    async def _harvest(self, run: JobRun, force: bool = False, skip_gaps: bool = False) -> None:
        """Take finished lines into the buffer; write what is next in order (all of it, in order,
        when stopping: lines that never ran leave gaps)."""
        for number, task in list(run.pending.items()):
            if not task.done():
                continue
            del run.pending[number]
            if not task.cancelled():
                run.done[number] = task.result()  # _line turns every failure into a failed line
        if not force and time.monotonic() - run.flushed_at < FLUSH_EVERY_S and len(run.done) < 64:
            return
        if skip_gaps:
            ready = sorted(run.done)
        else:
            ready = list(itertools.takewhile(run.done.__contains__, itertools.count(run.written + 1)))
        out: list[bytes] = []
        numbers: list[int] = []
        for number in ready:
            result = run.done.pop(number)
            run.written = number
            if result is BLANK:
                continue
            out.append((json.dumps(result.line, ensure_ascii=False) + "\n").encode())
            numbers.append(number)
            run.completed += result.kind == "completed"
            run.failed += result.kind == "failed"  # a skipped bad line is no request: counted apart
            run.output_tokens += result.output_tokens
            metrics.BATCH_LINES.labels(self.settings.model_name, result.kind).inc()
        run.flushed_at = time.monotonic()
        if not ready and not force:
            return
        if out:
            run.output.write(b"".join(out))
            run.output.flush()
            await asyncio.to_thread(os.fsync, run.output.fileno())
        elapsed = max(time.time() - (run.job.get("in_progress_at") or time.time()), 1e-3)
        # Durable first, then the record says so: a crash in between writes these lines again,
        # and the next runner truncates them away before it does.
        await self.store.update(run.id, written=run.written, output_offset=run.output.tell(), completed=run.completed,
                                failed=run.failed, output_tokens=run.output_tokens,
                                tokens_per_s=round(run.output_tokens / elapsed, 2))
        await self.store.forget_in_flight(run.id, numbers)

    async def _stop_pending(self, run: JobRun) -> None:
        for task in run.pending.values():
            task.cancel()
        await asyncio.gather(*run.pending.values(), return_exceptions=True)
        run.pending.clear()

    # ---- one line -------------------------------------------------------------------------------------

    async def _line(self, run: JobRun, line: BatchLine, known_rid: str | None) -> LineResult:
        async def redis_away(exc: Exception) -> None:
            # Redis away (a restart): the line is tried again once it answers. If its request
            # was already queued, it may run twice; its line is still written once.
            log.warning("event=batch_line_retry job=%s line=%d error=%r", run.id, line.number, exc)

        retry = async_outage_retry(cap_s=5.0, first_s=0.5, errors=(aioredis.RedisError, OSError))
        try:
            return await retry.call_with_retry(lambda: self._line_once(run, line, known_rid), redis_away)
        except Exception as exc:  # a bug on one line must not leave a hole that stalls the output
            log.exception("event=batch_line_failed job=%s line=%d", run.id, line.number)
            return request_failed(run.id, line, None, "internal_error",
                                  f"the gateway failed on this line: {exc!r}")

    async def _line_once(self, run: JobRun, line: BatchLine, known_rid: str | None) -> LineResult:
        cmd, opts = line.command, line.options
        key = dedup_key(run.id, line)
        if key is not None:
            first = self._answers.get(key)
            if first is not None:
                self._answers.move_to_end(key)
                result = await asyncio.shield(first)
                return copy_result(run.id, line, result)
            first = self._answers[key] = asyncio.get_running_loop().create_future()
            while len(self._answers) > BATCH_DEDUP_MAX:
                self._answers.popitem(last=False)
        try:
            result = await self._answer(run, line, cmd, opts, known_rid)
        except BaseException as exc:
            if key is not None and not first.done():
                self._answers.pop(key, None)
                first.set_exception(exc if isinstance(exc, Exception) else RuntimeError("stopped"))
                first.exception()  # retrieved: a copy that never came is no error of its own
            raise
        if key is not None and not first.done():
            first.set_result(result)
        return result

    async def _answer(self, run: JobRun, line: BatchLine, cmd, opts, known_rid: str | None) -> LineResult:
        if known_rid is not None:
            sink = AnswerQueue()
            if await self.lifecycle.follow_again(known_rid, cmd.id, sink):
                return await self._collect(run, line, opts, sink, known_rid)
        delay = 0.5
        while True:
            sink = AnswerQueue()
            try:
                admitted = await self.admission.admit(cmd, run.caller, sink, lane="batch",
                                                              store_answer=bool(run.job["warm_cache"]))
            except ProtocolError as err:
                if err.code in RETRYABLE:
                    await asyncio.sleep(delay)
                    delay = min(delay * 2, 10.0)
                    continue
                return request_failed(run.id, line, None, err.code, err.message, err.field)
            for event in admitted.cached:
                sink.send(event)
            if admitted.request_id:
                await self.store.record_in_flight(run.id, line.number, admitted.request_id,
                                                  self.store.ttl_s(run.job["completion_window_s"]))
            return await self._collect(run, line, opts, sink, admitted.request_id)

    async def _collect(self, run: JobRun, line: BatchLine, opts, sink: AnswerQueue, rid: str | None) -> LineResult:
        answer = render.Answer(opts.n)
        try:
            while True:
                event = await sink.events.get()
                if event["type"] == "token":
                    answer.add(event)
                elif event["type"] == "done":
                    served = rid or event.get("request_id")  # a cached answer's own id
                    body = render.completion_body(opts, served or f"cached-{line.number}", answer, event,
                                                  render.now(), served)
                    return LineResult(line.number, output_line(run.id, line, {"status_code": 200, "request_id": served,
                                                                              "body": body}, None),
                                      "completed", int((event.get("usage") or {}).get("completion_tokens") or 0))
                elif event["type"] == "error":
                    return request_failed(run.id, line, rid, event.get("code") or "internal_error",
                                          event.get("message") or "", event.get("field"))
        except asyncio.CancelledError:
            if rid is not None and run.stopping in ("cancelled", "expired"):
                self.lifecycle.abandon(rid, sink)  # the job stopped: so does its request
            elif rid is not None:  # the gateway stops (or lost the lease): the next runner follows it
                self.router.remove(rid, sink)
            raise

    # ---- finishing --------------------------------------------------------------------------------------

    async def _finalize(self, job: dict) -> None:
        await self._record_output(job, "batch_output")
        await self.store.move(job["id"], "completed")
        done = await self.store.get(job["id"])
        log.info("event=batch_completed job=%s completed=%d failed=%d output_tokens=%d", job["id"],
                 done["completed"], done["failed"], done["output_tokens"])

    async def _record_output(self, job: dict, purpose: str) -> None:
        if job.get("output_file_id") and self.store.path_for(job["output_file_id"]).exists():
            await self.store.add_file(job["output_file_id"], f"{job['id']}_output.jsonl", purpose,
                                      self.store.ttl_s(job["completion_window_s"]), job.get("owner", ""))
