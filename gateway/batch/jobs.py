"""Batch jobs and their files, as records in Redis and files on disk: no runner logic here.

A job is one hash (`ops/redis_keys.batch_job`): its fixed description, its state, counters and the
runner's progress (the next input line to queue, the lines written out, the output file's
length after them). Files (uploaded inputs, produced outputs and error reports) are plain files
in `Settings.batch_dir`, described by a hash each; every gateway and the runner must see the same
folder (one machine, or a shared volume). Every key expires `batch_retention_s` after the job's
completion window closes (`redis_keys.batch_ttl_s`); the lease is renewed and dropped by
ops/core/lua/{renew,drop}_lease.lua, so that only its holder can.

States follow OpenAI's Batch API: validating -> in_progress -> finalizing -> completed, or failed
(bad input), cancelling -> cancelled, expired (the window closed first).
"""
from __future__ import annotations

import json
import secrets
import time
from pathlib import Path

import redis.asyncio as aioredis

from ops.core import redis_keys, scripts
from ops.core.settings import Settings

FINAL = {"completed", "failed", "cancelled", "expired"}
TIMESTAMPS = ("in_progress_at", "finalizing_at", "completed_at", "failed_at", "expired_at", "cancelling_at",
              "cancelled_at")
COUNTERS = ("total", "completed", "failed", "cursor", "written", "output_offset", "output_tokens", "invalid")


def new_id(prefix: str) -> str:
    return f"{prefix}_{secrets.token_hex(12)}"


def parse_window(text: str | int | float) -> float:
    """`24h`, `90m`, `3600s` or seconds as a number -> seconds."""
    if isinstance(text, (int, float)) and not isinstance(text, bool):
        seconds = float(text)
    elif isinstance(text, str) and text[:-1].replace(".", "", 1).isdigit() and text[-1] in "hms":
        seconds = float(text[:-1]) * {"h": 3600, "m": 60, "s": 1}[text[-1]]
    else:
        raise ValueError(f"completion_window must look like 24h, 90m or 3600s (got {text!r})")
    if seconds <= 0:
        raise ValueError("completion_window must be positive")
    return seconds


class JobStore:
    def __init__(self, redis: aioredis.Redis, settings: Settings):
        self.redis = redis  # from ops.core.redis_clients: replies are str
        self.settings = settings
        self._renew_lease = scripts.register(redis, "renew_lease")
        self._drop_lease = scripts.register(redis, "drop_lease")
        self._write_held = scripts.register(redis, "write_held")

    # ---- files ----------------------------------------------------------------------------------

    def path_for(self, file_id: str) -> Path:
        self.settings.batch_dir.mkdir(parents=True, exist_ok=True)
        return self.settings.batch_dir / f"{file_id}.jsonl"

    def checked_path(self, job_id: str) -> Path:
        """A running job's input as validation checked it (gateway/batch/input.py), removed
        when the job ends."""
        self.settings.batch_dir.mkdir(parents=True, exist_ok=True)
        return self.settings.batch_dir / f"{job_id}.checked.jsonl"

    async def add_file(self, file_id: str, filename: str, purpose: str, ttl_s: float, owner: str = "") -> dict:
        path = self.path_for(file_id)
        record = {"id": file_id, "object": "file", "bytes": path.stat().st_size, "created_at": int(time.time()),
                  "filename": filename, "purpose": purpose, "path": str(path), "owner": owner}
        await self.redis.hset(redis_keys.batch_file(file_id), mapping={k: str(v) for k, v in record.items()})
        await self.redis.expire(redis_keys.batch_file(file_id), int(ttl_s))
        return record

    async def get_file(self, file_id: str) -> dict | None:
        raw = await self.redis.hgetall(redis_keys.batch_file(file_id))
        if not raw:
            return None
        return {**raw, "bytes": int(raw["bytes"]), "created_at": int(raw["created_at"])}

    # ---- jobs -----------------------------------------------------------------------------------

    async def create(self, input_file_id: str, endpoint: str, window_s: float, metadata: dict | None,
                     skip_invalid: bool, warm_cache: bool, owner: str = "") -> dict:
        job_id = new_id("batch")
        now = time.time()
        fields = {
            "id": job_id, "state": "validating", "endpoint": endpoint, "input_file_id": input_file_id,
            "completion_window_s": window_s, "created_at": int(now), "expires_at": int(now + window_s),
            "metadata": json.dumps(metadata or {}), "skip_invalid": int(skip_invalid), "warm_cache": int(warm_cache),
            "errors": "[]", "owner": owner, **{c: 0 for c in COUNTERS},
        }
        pipe = self.redis.pipeline(transaction=True)
        pipe.hset(redis_keys.batch_job(job_id), mapping={k: str(v) for k, v in fields.items()})
        pipe.expire(redis_keys.batch_job(job_id), self.ttl_s(window_s))
        pipe.zadd(redis_keys.BATCH_JOBS, {job_id: now})
        pipe.sadd(redis_keys.BATCH_ACTIVE, job_id)
        await pipe.execute()
        return await self.get(job_id)

    def ttl_s(self, window_s: float) -> int:
        """How long a job's keys (and its files') live, for a job with this completion window."""
        return redis_keys.batch_ttl_s(self.settings, window_s)

    async def get(self, job_id: str) -> dict | None:
        raw = await self.redis.hgetall(redis_keys.batch_job(job_id))
        return decode_job(raw) if raw else None

    async def list(self, limit: int = 20, after: str | None = None, owner: str | None = None) -> list[dict]:
        """Newest first (one owner's, when given); ids whose record expired leave the index on the way."""
        ids = await self.redis.zrevrange(redis_keys.BATCH_JOBS, 0, -1)
        if after in ids:
            ids = ids[ids.index(after) + 1:]
        jobs = []
        for job_id in ids:
            job = await self.get(job_id)
            if job is None:
                await self.redis.zrem(redis_keys.BATCH_JOBS, job_id)
                continue
            if owner is not None and job.get("owner", "") != owner:
                continue
            jobs.append(job)
            if len(jobs) >= limit:
                break
        return jobs

    async def update(self, job_id: str, held_by: str | None = None, **fields) -> bool:
        """Fields into the job's record. A runner passes `held_by` (its lease's holder): then the
        record is written only while that holder has the job's lease, and False says it was not."""
        encoded = {k: json.dumps(v) if isinstance(v, (list, dict)) else str(int(v) if isinstance(v, bool) else v)
                   for k, v in fields.items()}
        if held_by is None:
            await self.redis.hset(redis_keys.batch_job(job_id), mapping=encoded)
            return True
        pairs = [part for item in encoded.items() for part in item]
        return await self._write_held(keys=[redis_keys.batch_lease(job_id), redis_keys.batch_job(job_id)],
                                      args=[held_by, *pairs]) == 1

    async def move(self, job_id: str, state: str, held_by: str | None = None) -> bool:
        """Into a state, stamping its time; a final state leaves the runners' set. With `held_by`,
        only while that holder has the lease (as `update`)."""
        stamp = f"{state}_at"
        fields = {"state": state}
        if stamp in TIMESTAMPS:
            fields[stamp] = int(time.time())
        if not await self.update(job_id, held_by, **fields):
            return False
        if state in FINAL:
            await self.redis.srem(redis_keys.BATCH_ACTIVE, job_id)
        return True

    async def request_cancel(self, job_id: str) -> dict | None:
        """cancelling, when the job can still stop; the runner finishes the move to cancelled."""
        job = await self.get(job_id)
        if job is None:
            return None
        if job["state"] in ("validating", "in_progress", "finalizing"):
            await self.update(job_id, cancel_requested=1)
            await self.move(job_id, "cancelling")
            job = await self.get(job_id)
        return job

    async def active(self) -> list[str]:
        return sorted(await self.redis.smembers(redis_keys.BATCH_ACTIVE))

    async def forget_active(self, job_id: str) -> None:
        """A job whose record expired leaves the runners' set."""
        await self.redis.srem(redis_keys.BATCH_ACTIVE, job_id)

    # ---- the runner's lease ----------------------------------------------------------------------

    async def take_lease(self, job_id: str, holder: str, ttl_s: int) -> bool:
        return bool(await self.redis.set(redis_keys.batch_lease(job_id), holder, nx=True, ex=ttl_s))

    async def renew_lease(self, job_id: str, holder: str, ttl_s: int) -> bool:
        return bool(await self._renew_lease(keys=[redis_keys.batch_lease(job_id)], args=[holder, ttl_s]))

    async def drop_lease(self, job_id: str, holder: str) -> None:
        await self._drop_lease(keys=[redis_keys.batch_lease(job_id)], args=[holder])

    # ---- lines in flight -------------------------------------------------------------------------

    async def record_in_flight(self, job_id: str, number: int, request_id: str, ttl_s: int) -> None:
        pipe = self.redis.pipeline(transaction=False)
        pipe.hset(redis_keys.batch_in_flight(job_id), str(number), request_id)
        pipe.expire(redis_keys.batch_in_flight(job_id), ttl_s)
        await pipe.execute()

    async def in_flight(self, job_id: str) -> dict[int, str]:
        return {int(k): v for k, v in (await self.redis.hgetall(redis_keys.batch_in_flight(job_id))).items()}

    async def forget_in_flight(self, job_id: str, numbers: list[int]) -> None:
        if numbers:
            await self.redis.hdel(redis_keys.batch_in_flight(job_id), *[str(n) for n in numbers])


def decode_job(raw: dict) -> dict:
    job = dict(raw)
    for name in COUNTERS + ("created_at", "expires_at", "skip_invalid", "warm_cache", "cancel_requested") + TIMESTAMPS:
        if name in job:
            job[name] = int(float(job[name]))
    job["completion_window_s"] = float(job.get("completion_window_s", 0))
    job["metadata"] = json.loads(job.get("metadata") or "{}")
    job["errors"] = json.loads(job.get("errors") or "[]")
    return job


def public_view(job: dict) -> dict:
    """The job as OpenAI's Batch object (plus Brigade's own `brigade` field)."""
    window = job["completion_window_s"]
    errors = job["errors"]
    view = {
        "id": job["id"], "object": "batch", "endpoint": job["endpoint"],
        "errors": {"object": "list", "data": errors} if errors else None,
        "input_file_id": job["input_file_id"],
        "completion_window": f"{window / 3600:g}h" if window % 3600 == 0 else f"{window:g}s",
        "status": job["state"], "output_file_id": job.get("output_file_id") or None,
        "error_file_id": job.get("error_file_id") or None, "created_at": job["created_at"],
        "expires_at": job["expires_at"], **{t: job.get(t) for t in TIMESTAMPS},
        "request_counts": {"total": job["total"], "completed": job["completed"], "failed": job["failed"]},
        "metadata": job["metadata"],
        "brigade": {"output_tokens": job["output_tokens"], "invalid_lines": job["invalid"],
                    "written": job["written"], "skip_invalid": bool(job["skip_invalid"]),
                    "warm_cache": bool(job["warm_cache"]),
                    "tokens_per_s": job.get("tokens_per_s") and float(job["tokens_per_s"])},
    }
    return view
