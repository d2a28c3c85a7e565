"""Files in the batch folder whose records expired, removed, so that the folder does not grow for ever.

A file's record (`keys.batch_file`) and a job's (`keys.batch_job`) expire in Redis
`batch_retention_s` after the job's completion window; the bytes on disk go here. Every gateway
sweeps the folder once an hour (removing a file twice is nothing). A file goes once nothing in
Redis names it and it has not been written to for `batch_retention_s`: an output being written
has no file record until its job ends, so a file an active job names is kept too, and so is one
written to lately (a file written just before its record is). Half files (`*.part`: a copy or a
check that a crash cut short) go after an hour.
"""
from __future__ import annotations

import asyncio
import logging
import time
from pathlib import Path

import redis.asyncio as aioredis

from gateway.batch.jobs import JobStore

log = logging.getLogger("brigade.batch")

SWEEP_EVERY_S = 3600.0
PART_AGE_S = 3600.0  # a copy or a check takes seconds; an hour-old half file's writer is gone
CHECKED = ".checked.jsonl"  # a job's checked input (JobStore.checked_path), named by the job's id


class FileSweep:
    def __init__(self, store: JobStore):
        self.store = store
        self.folder = store.settings.batch_dir
        self.retention_s = store.settings.batch_retention_s

    async def run(self) -> None:
        while True:
            try:
                removed = await self.sweep()
                if removed:
                    log.info("event=batch_files_swept removed=%d", len(removed))
            except (aioredis.RedisError, OSError) as exc:  # Redis away, the folder unreadable: next hour
                log.warning("event=batch_sweep_failed error=%r", exc)
            await asyncio.sleep(SWEEP_EVERY_S)

    async def sweep(self) -> list[str]:
        """Remove what is due; the names removed."""
        if not self.folder.is_dir():
            return []
        named = await self._named_by_active_jobs()
        now = time.time()
        removed = []
        for path in self.folder.iterdir():
            try:
                age = now - path.stat().st_mtime
            except FileNotFoundError:  # another gateway's sweep, or a runner's rename
                continue
            if path.name.endswith(".part"):
                due = age > PART_AGE_S
            else:
                due = age > self.retention_s and await self._unnamed(path, named)
            if not due:
                continue
            try:
                path.unlink(missing_ok=True)
            except OSError as exc:  # not ours to remove (permissions): said, and the rest still swept
                log.warning("event=batch_file_not_removed file=%s error=%r", path.name, exc)
                continue
            removed.append(path.name)
        return removed

    async def _named_by_active_jobs(self) -> set[str]:
        """Every id a job not yet ended names: itself (its checked file), its input and its output."""
        named: set[str] = set()
        for job_id in await self.store.active():
            job = await self.store.get(job_id)
            named.add(job_id)
            if job is not None:
                named.update(x for x in (job.get("input_file_id"), job.get("output_file_id")) if x)
        return named

    async def _unnamed(self, path: Path, named: set[str]) -> bool:
        """Neither an active job nor a record in Redis names the file."""
        if path.name.endswith(CHECKED):
            job_id = path.name[:-len(CHECKED)]
            return job_id not in named and await self.store.get(job_id) is None
        if path.suffix == ".jsonl":
            file_id = path.stem
            return file_id not in named and await self.store.get_file(file_id) is None
        return False  # not a file Brigade writes: left alone
