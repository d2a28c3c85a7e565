"""A job's output, written in input order, each line once, through crashes.

Results come back in any order; each waits in a reorder buffer until every line before it is
written (the buffer holds no more than the window of lines in flight). Written lines are
fsynced, and only then does the job's record say how far the output got (lines written, bytes of
output, counts) and forget their request ids: durable first, then recorded, and recorded only
while this runner holds the job's lease (gateway/batch/lease.py). A crash in between
leaves lines past the recorded length; the next writer of the job starts from a new file that
holds only the recorded length (`open`) and writes them again; so a line is in the output once,
whoever wrote it.

A new file, not the old one cut back in place: a runner that lost its lease without knowing it
(a stall, a Redis failover) may still have the old file open, and its next write would land in
the middle of the new runner's lines, or past their end with a hole of zero bytes before it.
Renamed over the output's path, the new file takes the name; the old one keeps only its stale
writer, whose record update the lease then refuses.

Flushes are batched (at most every FLUSH_EVERY_S, or once FLUSH_LINES results wait) so that a
fast job does not fsync once a line.
"""
from __future__ import annotations

import asyncio
import itertools
import json
import logging
import os
import secrets
import time
from pathlib import Path
from typing import BinaryIO

from gateway import metrics
from gateway.batch.jobs import JobStore
from gateway.batch.lease import JobLease
from gateway.batch.output import BLANK, LineResult

log = logging.getLogger("brigade.batch")

FLUSH_EVERY_S = 0.5
FLUSH_LINES = 64


class OrderedWriter:
    def __init__(self, store: JobStore, job: dict, lease: JobLease, output: BinaryIO, model_name: str):
        self.store = store
        self.job = job
        self.lease = lease  # the record is written through it: only while this runner holds the job
        self.output = output  # the output file, open for binary writing at the recorded length
        self.model_name = model_name  # the metrics' label
        # Where the record says the output got: every input line up to `written` is in it.
        self.written: int = job["written"]
        self.completed: int = job["completed"]
        self.failed: int = job["failed"]
        self.output_tokens: int = job["output_tokens"]
        self.waiting: dict[int, LineResult] = {}  # the reorder buffer: input line number -> its result
        self.flushed_at = 0.0

    @classmethod
    async def open(cls, store: JobStore, job: dict, lease: JobLease, model_name: str) -> OrderedWriter:
        """The job's output as far as its record vouches for it, in a new file of this runner's own."""
        path = store.path_for(job["output_file_id"])
        output = await asyncio.to_thread(_fresh_copy, path, job["output_offset"])
        if output.tell() < job["output_offset"]:  # the file lost lines the record counts: said, not hidden
            log.error("event=batch_output_short job=%s recorded_bytes=%d found_bytes=%d", job["id"],
                      job["output_offset"], output.tell())
        return cls(store, job, lease, output, model_name)

    def close(self) -> None:
        self.output.close()

    def put(self, number: int, result: LineResult) -> None:
        """A line's result, into the reorder buffer."""
        self.waiting[number] = result

    async def flush(self, force: bool = False, skip_gaps: bool = False) -> None:
        """Write what is next in order, when enough waits or enough time passed (always when
        `force`); when stopping (`skip_gaps`), everything waiting, in order: the lines that never
        ran leave gaps."""
        if not force and time.monotonic() - self.flushed_at < FLUSH_EVERY_S and len(self.waiting) < FLUSH_LINES:
            return
        if skip_gaps:
            ready = sorted(self.waiting)
        else:
            ready = list(itertools.takewhile(self.waiting.__contains__, itertools.count(self.written + 1)))
        out: list[bytes] = []
        numbers: list[int] = []
        for number in ready:
            result = self.waiting.pop(number)
            self.written = number
            if result is BLANK:
                continue
            out.append((json.dumps(result.line, ensure_ascii=False) + "\n").encode())
            numbers.append(number)
            self.completed += result.kind == "completed"
            self.failed += result.kind == "failed"  # a skipped bad line is no request: counted apart
            self.output_tokens += result.output_tokens
            metrics.BATCH_LINES.labels(self.model_name, result.kind).inc()
        self.flushed_at = time.monotonic()
        if not ready and not force:
            return
        if out:
            self.output.write(b"".join(out))
            self.output.flush()
            await asyncio.to_thread(os.fsync, self.output.fileno())
        elapsed = max(time.time() - (self.job.get("in_progress_at") or time.time()), 1e-3)
        # Durable first, then the record says so: a crash in between writes these lines again, and
        # the next writer leaves them out of its copy before it does. LeaseLost, if this runner
        # is no longer the job's: then these lines are in a file nobody reads.
        await self.lease.update(written=self.written, output_offset=self.output.tell(), completed=self.completed,
                                failed=self.failed, output_tokens=self.output_tokens,
                                tokens_per_s=round(self.output_tokens / elapsed, 2))
        await self.store.forget_in_flight(self.job["id"], numbers)


def _fresh_copy(path: Path, length: int) -> BinaryIO:
    """A new file put in `path`'s place, holding the first `length` bytes of the old one (as many
    as it has), durable, and open for writing at its end."""
    part = path.with_name(f"{path.name}.{secrets.token_hex(4)}.part")
    output = open(part, "w+b")
    try:
        if path.exists():
            with open(path, "rb") as old:
                left = length
                while left and (chunk := old.read(min(left, 1 << 20))):
                    output.write(chunk)
                    left -= len(chunk)
        output.flush()
        os.fsync(output.fileno())
        os.replace(part, path)
        directory = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(directory)  # the rename, durable too
        finally:
            os.close(directory)
    except BaseException:
        output.close()
        part.unlink(missing_ok=True)
        raise
    return output
