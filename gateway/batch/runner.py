"""Runs batch jobs inside the gateways: whichever gateway holds a job's lease runs it.

Every gateway looks for active jobs once a `batch_poll_s` and takes the lease of any job nobody
holds (gateway/batch/lease.py), so a job outlives the gateway that started it: when that gateway
stops or dies, the lease lapses and another gateway (or the same one, restarted) continues.

Running a job moves it through its states (gateway/batch/jobs.py): validating checks every line
first (all bad lines reported at once) and keeps each verdict in the job's checked file, so that no
line is parsed twice; in_progress streams the checked file, keeping a window of lines in flight (`LinesInFlight`), each
run through admission on the batch lane (gateway/batch/lines.py), and writes the results in input
order (gateway/batch/writer.py); finalizing records the output file. The window is the live
workers' batch width (`max_batch` each) shared among the jobs this gateway runs, unless
`batch_window` sets it: enough to fill every engine row, while each worker's other task threads
(it takes `worker_concurrency`, twice its batch width, off the queue) stay free for interactive
requests, which would otherwise wait on the queue for a batch line to end before a worker took
them.

A job continued after a crash truncates the output to the recorded length, follows the requests
still in flight through their replay logs (each was queued once), and queues the rest: each
custom_id is written exactly once even when its request ran twice.
"""
from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from typing import Coroutine

import redis.asyncio as aioredis

from gateway.admission.api_keys import ApiKey, KeyStore
from gateway.admission.lifecycle import Caller
from gateway.admission.load import LoadMonitor
from gateway.batch.input import MAX_REASONS_SHOWN, BadLine, Checker, read_checked, write_checked
from gateway.batch.jobs import JobStore, new_id
from gateway.batch.lease import JobLease, LeaseLost
from gateway.batch.lines import LineRunner, RunningJob
from gateway.batch.output import BLANK, LineResult, invalid_result
from gateway.batch.writer import OrderedWriter
from gateway.request import RequestRules
from ops.core.settings import Settings

log = logging.getLogger("brigade.batch")

STOP_CHECK_EVERY_S = 0.5  # how often a running job's record is read for a cancel or its expiry
WAIT_SOME_S = 0.5  # a full window waits this long at most for a line, then looks for a stop again


class LinesInFlight:
    """A job's window: the task of each line in flight, by input line number."""

    def __init__(self, job_id: str):
        self.job_id = job_id
        self.tasks: dict[int, asyncio.Task[LineResult]] = {}

    def __len__(self) -> int:
        return len(self.tasks)

    def start(self, number: int, line: Coroutine[None, None, LineResult]) -> None:
        self.tasks[number] = asyncio.create_task(line, name=f"batch-line:{self.job_id}:{number}")

    async def wait_some(self, timeout_s: float = WAIT_SOME_S) -> None:
        """Until a line finishes, or the timeout."""
        await asyncio.wait(list(self.tasks.values()), timeout=timeout_s, return_when=asyncio.FIRST_COMPLETED)

    def finished(self) -> list[tuple[int, LineResult]]:
        """The lines that finished, out of the window (a cancelled line leaves no result)."""
        done = []
        for number, task in list(self.tasks.items()):
            if not task.done():
                continue
            del self.tasks[number]
            if not task.cancelled():
                done.append((number, task.result()))  # a line turns every failure into a failed line
        return done

    async def stop(self) -> None:
        """Cancel every line and wait for them to go."""
        for task in self.tasks.values():
            task.cancel()
        await asyncio.gather(*self.tasks.values(), return_exceptions=True)
        self.tasks.clear()

    def leave(self) -> None:
        """Cancel every line without waiting (the gateway stops, or an error ends the pass)."""
        for task in self.tasks.values():
            task.cancel()


@dataclass
class JobRun:
    """One runner's pass over one job: the job as its lines see it, its window, its output."""

    job: RunningJob
    window: LinesInFlight
    output: OrderedWriter
    checked_at: float = 0.0  # when the record was last read for a cancel or an expiry

    @property
    def id(self) -> str:
        return self.job.id


class BatchRunner:
    def __init__(self, settings: Settings, store: JobStore, rules: RequestRules, lines: LineRunner,
                 load: LoadMonitor, key_store: KeyStore, holder: str):
        self.settings = settings
        self.store = store
        self.rules = rules  # what checks a line's body, as the HTTP door does
        self.lines = lines
        self.load = load
        self.key_store = key_store
        self.holder = holder  # this gateway's id, on the leases it takes
        self.running: dict[str, asyncio.Task] = {}  # job id -> the task running it here

    # ---- finding work -----------------------------------------------------------------------------

    async def run(self) -> None:
        while True:
            try:
                for job_id in await self.store.active():
                    if job_id in self.running:
                        continue
                    lease = JobLease(self.store, job_id, self.holder, self.settings)
                    if await lease.take():
                        self.running[job_id] = asyncio.create_task(self._run(lease), name=f"batch-job:{job_id}")
            except aioredis.RedisError as exc:
                log.warning("event=batch_poll_failed error=%r", exc)
            await asyncio.sleep(self.settings.batch_poll_s)

    async def close(self) -> None:
        for task in list(self.running.values()):
            task.cancel()
        await asyncio.gather(*self.running.values(), return_exceptions=True)

    async def _run(self, lease: JobLease) -> None:
        job_id = lease.job_id
        lease.keep()
        try:
            job = await self.store.get(job_id)
            if job is None:  # expired
                await self.store.forget_active(job_id)
                self.store.checked_path(job_id).unlink(missing_ok=True)
                return
            log.info("event=batch_job_taken job=%s state=%s written=%d", job_id, job["state"], job["written"])
            if job["state"] == "validating":
                await self._validate(job, lease)
                job = await self.store.get(job_id)
            if job["state"] in ("in_progress", "cancelling"):
                await self._execute(job, lease)
                job = await self.store.get(job_id)
            if job["state"] == "finalizing":
                await self._finalize(job, lease)
        except LeaseLost:
            log.warning("event=batch_lease_lost job=%s", job_id)
        except asyncio.CancelledError:
            raise
        except Exception:  # the job stays active: the next poll (here or elsewhere) continues it
            log.exception("event=batch_job_failed job=%s", job_id)
            await asyncio.sleep(self.settings.batch_poll_s)
        finally:
            self.running.pop(job_id, None)
            await lease.drop()

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
        return Checker(self.rules)

    # ---- validating --------------------------------------------------------------------------------

    async def _validate(self, job: dict, lease: JobLease) -> None:
        record = await self.store.get_file(job["input_file_id"])
        if record is None:
            await self._fail(job, lease, [{"code": "input_missing", "message": "the input file is gone (expired?)",
                                    "line": None}])
            return
        valid, bad, count_bad = await asyncio.to_thread(write_checked, record["path"], self.checker(),
                                                        self.store.checked_path(job["id"]))
        if bad and not job["skip_invalid"]:
            await lease.update(invalid=count_bad)
            await self._fail(job, lease, bad)
            return
        if valid == 0:
            await self._fail(job, lease, bad or [{"code": "empty_input", "message": "the input has no request lines",
                                           "line": None}])
            return
        await lease.update(total=valid, invalid=count_bad, errors=bad, output_file_id=new_id("file"))
        await lease.move("in_progress")
        log.info("event=batch_validated job=%s lines=%d invalid=%d", job["id"], valid, count_bad)

    async def _fail(self, job: dict, lease: JobLease, errors: list[dict]) -> None:
        await lease.update(errors=errors[:MAX_REASONS_SHOWN])
        await lease.move("failed")
        self.store.checked_path(job["id"]).unlink(missing_ok=True)
        log.info("event=batch_failed job=%s errors=%d", job["id"], len(errors))

    # ---- running -------------------------------------------------------------------------------------

    async def _execute(self, job: dict, lease: JobLease) -> None:
        checked = self.store.checked_path(job["id"])
        if not checked.exists():  # begun before checked files were kept, or its folder was replaced
            record = await self.store.get_file(job["input_file_id"])
            if record is None:
                await self._fail(job, lease, [{"code": "input_missing", "message": "the input file is gone (expired?)",
                                        "line": None}])
                return
            await asyncio.to_thread(write_checked, record["path"], self.checker(), checked)
        output = await OrderedWriter.open(self.store, job, lease, self.settings.model_name)
        running = RunningJob(job["id"], Caller(await self._owner_key(job), "batch"), bool(job["warm_cache"]),
                             self.store.ttl_s(job["completion_window_s"]))
        run = JobRun(running, LinesInFlight(job["id"]), output)
        known = await self.store.in_flight(job["id"])
        stopping: str | None = None
        try:
            for number, verdict in read_checked(checked):
                if number <= output.written:
                    continue
                stopping = stopping or await self._should_stop(run, lease)
                if stopping:
                    break
                if verdict is None:
                    output.put(number, BLANK)
                elif isinstance(verdict, BadLine):
                    output.put(number, invalid_result(run.id, verdict))
                else:
                    while len(run.window) >= self.window() and not stopping:
                        await self._wait_some(run)
                        stopping = await self._should_stop(run, lease)
                    if stopping:
                        break
                    run.window.start(number, self.lines.run(running, verdict, known.get(number)))
                await self._harvest(run)
            while run.window and not stopping:
                await self._wait_some(run)
                stopping = await self._should_stop(run, lease)
            if stopping:
                running.stopping = stopping
                await run.window.stop()
            if stopping != "lease":  # without the lease, the output is another runner's now
                await self._harvest(run, force=True, skip_gaps=bool(stopping))
        finally:
            output.close()
            if run.window:  # left by an error (Redis away) or a shutdown: the next pass follows them
                running.stopping = running.stopping or "lease"
                run.window.leave()
        if stopping == "lease":
            raise LeaseLost(run.id)
        if stopping in ("cancelled", "expired"):
            await lease.move(stopping)
            checked.unlink(missing_ok=True)
            await self._record_output(job, "batch_output")
            log.info("event=batch_%s job=%s written=%d", stopping, run.id, output.written)
            return
        await lease.move("finalizing")

    async def _should_stop(self, run: JobRun, lease: JobLease) -> str | None:
        if lease.lost.is_set():
            return "lease"
        now = time.monotonic()
        if now - run.checked_at < STOP_CHECK_EVERY_S:
            return None
        run.checked_at = now
        job = await self.store.get(run.id)
        if job is None or job.get("cancel_requested"):
            return "cancelled"
        if time.time() > job["expires_at"]:
            return "expired"
        return None

    async def _wait_some(self, run: JobRun) -> None:
        await run.window.wait_some()
        await self._harvest(run)

    async def _harvest(self, run: JobRun, force: bool = False, skip_gaps: bool = False) -> None:
        """Finished lines from the window into the reorder buffer; then what is next in order, out."""
        for number, result in run.window.finished():
            run.output.put(number, result)
        await run.output.flush(force, skip_gaps)

    # ---- finishing --------------------------------------------------------------------------------------

    async def _finalize(self, job: dict, lease: JobLease) -> None:
        await self._record_output(job, "batch_output")
        await lease.move("completed")
        self.store.checked_path(job["id"]).unlink(missing_ok=True)
        done = await self.store.get(job["id"])
        log.info("event=batch_completed job=%s completed=%d failed=%d output_tokens=%d", job["id"],
                 done["completed"], done["failed"], done["output_tokens"])

    async def _record_output(self, job: dict, purpose: str) -> None:
        if job.get("output_file_id") and self.store.path_for(job["output_file_id"]).exists():
            await self.store.add_file(job["output_file_id"], f"{job['id']}_output.jsonl", purpose,
                                      self.store.ttl_s(job["completion_window_s"]), job.get("owner", ""))
