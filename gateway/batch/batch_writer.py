"""A job's output, written in input order, each line once, through crashes.

Results come back in any order; each waits in a reorder buffer until every line before it is
written (the buffer holds no more than the window of lines in flight). Written lines are
fsynced, and only then does the job's record say how far the output got (lines written, bytes of
output, counts) and forget their request ids: durable first, then recorded. A crash in between
leaves lines past the recorded length, which the next writer of the job truncates away before it
writes them again; so a line is in the output once, whoever wrote it.

Flushes are batched (at most every FLUSH_EVERY_S, or once FLUSH_LINES results wait) so that a
fast job does not fsync once a line.
"""
from __future__ import annotations

import asyncio
import itertools
import json
import os
import time
from typing import BinaryIO

from gateway import metrics
from gateway.batch.batch_jobs import JobStore
from gateway.batch.batch_output import BLANK, LineResult

FLUSH_EVERY_S = 0.5
FLUSH_LINES = 64


class OrderedWriter:
    def __init__(self, store: JobStore, job: dict, output: BinaryIO, model_name: str):
        self.store = store
        self.job = job
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
    def open(cls, store: JobStore, job: dict, model_name: str) -> OrderedWriter:
        """The job's output, cut back to the length its record vouches for."""
        path = store.path_for(job["output_file_id"])
        output = open(path, "r+b" if path.exists() else "w+b")
        output.truncate(job["output_offset"])  # anything past it was written by a runner that died
        output.seek(job["output_offset"])
        return cls(store, job, output, model_name)

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
        # Durable first, then the record says so: a crash in between writes these lines again,
        # and the next writer truncates them away before it does.
        await self.store.update(self.job["id"], written=self.written, output_offset=self.output.tell(),
                                completed=self.completed, failed=self.failed, output_tokens=self.output_tokens,
                                tokens_per_s=round(self.output_tokens / elapsed, 2))
        await self.store.forget_in_flight(self.job["id"], numbers)
