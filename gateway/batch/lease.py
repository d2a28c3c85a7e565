"""A gateway's lease on one batch job: only the gateway holding it runs the job and writes its output.

The lease is a key with a short TTL (`redis_keys.batch_lease`, `batch_lease_s`): taken only when nobody
holds it, renewed every third of its TTL by a task of its own while the job runs here, dropped at
the end. Renewing and dropping happen only while this gateway still holds it
(ops/core/lua/{renew,drop}_lease.lua), so a gateway that stalled past its TTL cannot take the job
back from the one that continued it: its renewal fails and `lost` is set instead. A gateway that
stops or dies simply stops renewing; the lease lapses and another gateway takes the job.

A lease can also be lost unseen: a stall longer than the TTL, or a Redis failover that dropped
the key, and two gateways both think they run the job. So a runner writes the job's record only
through its lease (`update`, `move`: ops/core/lua/write_held.lua checks the holder in the same
step), and a refusal raises `LeaseLost`: what the record says is only ever the holder's. The
output file is fenced apart (gateway/batch/writer.py).
"""
from __future__ import annotations

import asyncio
import logging

import redis.asyncio as aioredis

from gateway.batch.jobs import JobStore
from ops.core import redis_keys
from ops.core.settings import Settings

log = logging.getLogger("brigade.batch")


class LeaseLost(Exception):
    """The job's lease is another gateway's (or nobody's) now: this runner stops, writing nothing more."""


class JobLease:
    def __init__(self, store: JobStore, job_id: str, holder: str, settings: Settings):
        self.store = store
        self.job_id = job_id
        self.holder = holder  # this gateway's id, written on the lease
        self.ttl_s = redis_keys.batch_lease_ttl_s(settings)
        self.renew_every_s = settings.batch_lease_s / 3
        self.lost = asyncio.Event()  # set once a renewal finds the lease no longer this gateway's
        self._renewer: asyncio.Task | None = None

    async def take(self) -> bool:
        """The lease, if nobody holds it."""
        return await self.store.take_lease(self.job_id, self.holder, self.ttl_s)

    def keep(self) -> None:
        """Renew the lease until `drop`, or until it is lost."""
        self._renewer = asyncio.create_task(self._renew(), name=f"batch-lease:{self.job_id}")

    async def drop(self) -> None:
        """Stop renewing and give the lease up (a Redis that does not answer lets it lapse instead)."""
        if self._renewer is not None:
            self._renewer.cancel()
        try:
            await self.store.drop_lease(self.job_id, self.holder)
        except aioredis.RedisError:
            pass

    async def update(self, **fields) -> None:
        """Fields into the job's record, while this gateway holds the lease; `LeaseLost` if not."""
        self._written(await self.store.update(self.job_id, self.holder, **fields))

    async def move(self, state: str) -> None:
        """The job into `state`, while this gateway holds the lease; `LeaseLost` if not."""
        self._written(await self.store.move(self.job_id, state, self.holder))

    def _written(self, written: bool) -> None:
        if not written:
            self.lost.set()
            raise LeaseLost(self.job_id)

    async def _renew(self) -> None:
        while True:
            await asyncio.sleep(self.renew_every_s)
            try:
                if not await self.store.renew_lease(self.job_id, self.holder, self.ttl_s):
                    self.lost.set()
                    return
            except aioredis.RedisError as exc:
                log.warning("event=batch_lease_renew_failed job=%s error=%r", self.job_id, exc)
