"""Who runs a request, fenced: the atomic claim, the fenced publish, hand-back, reaping, burial.

A request's claim record (`redis_keys.claim`) holds an epoch that only grows, the owner (a worker
process's instance id), a state and the number of attempts. Every change is one Lua script, so
that it is atomic against every other worker and reaper:

- claim: a worker takes the request unless it is finished, dead, or held by a live owner; the
  epoch goes up and the owner is recorded in `redis_keys.CLAIMS` (the reaper's list). A claim already
  the caller's comes back as `mine` with its epoch (workers/serving.py tells a claim of its own
  whose reply a failover lost from a second delivery of a request it runs).
- publish: a step's events are published and logged only for requests whose claim still carries
  the publisher's epoch; the others come back as fenced, and their worker drops them. So a worker
  that stalled and was taken over can never write into the stream again.
- release (graceful hand-back) and reap (owner's heartbeat expired): the epoch goes up, which
  fences the old owner, and the request is free to be claimed again.
- engage: the worker's engine starts computing the request; only a run that did counts as an
  attempt when its worker dies (a request that merely waited for a row is no poison).
- bury: after max_attempts claims that ended in a crash while the request was computed, the
  request goes to the dead-letter list.

The scripts are ops/core/lua/{claim,publish,release,reap,bury,take_unclaimed,retake,engage}.lua. A claim or a
reap that finds max_attempts reached answers 'bury' with the claim's epoch, and bury.lua buries
the request only if the claim is still as it was seen: two deciders bury it once, and a caller
that dies in between leaves a running claim of a dead owner, which the reaper buries next.
"""
from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass

import redis

from ops.core import redis_keys, scripts
from ops.core.messages import QueuedRequest, ReplyEvent
from ops.core.settings import Settings

QUEUED = "queued"  # claim state of a request sent to the queue again (the others live in the scripts)
MOVED = "moved"  # claim.lua: the owner changed since the caller read it; read it again
MINE = "mine"  # claim.lua: the claim is already the caller's (workers/serving.py decides what that means)
BURY = "bury"  # claim.lua and reap.lua: max_attempts reached; bury.lua buries it

TTL_REFRESH_TOKENS = 32

log = logging.getLogger("brigade.worker")


@dataclass(frozen=True)
class Published:
    fenced: set[str]  # request ids whose claim another worker holds now: their events went nowhere
    gaps: dict[str, int]  # request id -> tokens its log holds, when that is fewer than its events assumed


@dataclass(frozen=True)
class Claim:
    outcome: str  # claimed | mine (already this caller's: Serving decides) | busy | done | dead | gone
    epoch: int
    attempts: int


class ClaimStore:
    """Over a client from ops.core.redis_clients (replies decoded to str)."""

    def __init__(self, client: redis.Redis, settings: Settings):
        self.redis = client
        self.settings = settings
        self.max_attempts = settings.max_attempts
        self._claim = scripts.register(client, "claim")
        self._publish = scripts.register(client, "publish")
        self._release = scripts.register(client, "release")
        self._reap = scripts.register(client, "reap")
        self._bury = scripts.register(client, "bury")
        self._take_unclaimed = scripts.register(client, "take_unclaimed")
        self._engage = scripts.register(client, "engage")
        self._retake = scripts.register(client, "retake")

    @classmethod
    def from_settings(cls, client: redis.Redis, settings: Settings) -> "ClaimStore":
        return cls(client, settings)

    def _buried(self, rid: str, seen_epoch: str) -> bool:
        """Bury the request if its claim still carries the epoch its decider saw."""
        return bool(self._bury(
            keys=[redis_keys.claim(rid), redis_keys.CLAIMS, redis_keys.request(rid), redis_keys.DEAD_LETTERS, redis_keys.stream(rid)],
            args=[rid, seen_epoch, self.max_attempts, time.time(), redis_keys.dead_letters_max(self.settings),
                  redis_keys.stream_maxlen(self.settings), redis_keys.stream_ttl_s(self.settings)]))

    def claim(self, rid: str, me: str) -> Claim:
        # Whether a running claim's owner lives is its heartbeat key, named by the owner: read the
        # owner first so that the key can be passed in KEYS; the script says 'moved' if it changed.
        while True:
            owner = self.redis.hget(redis_keys.claim(rid), "owner") or ""
            outcome, epoch, attempts = self._claim_confirmed(
                rid, keys=[redis_keys.claim(rid), redis_keys.CLAIMS, redis_keys.request(rid), redis_keys.UNCLAIMED, redis_keys.TAKEN,
                           redis_keys.worker(owner)],
                args=[rid, me, self.max_attempts, redis_keys.claim_ttl_s(self.settings), owner],
            )
            if outcome == BURY:
                self._buried(rid, epoch)  # here or by whoever decided it too: dead either way
                return Claim("dead", 0, int(attempts))
            if outcome != MOVED:
                return Claim(outcome, int(epoch), int(attempts))

    def _claim_confirmed(self, rid: str, keys: list[str], args: list) -> list:
        """claim.lua, then, when `confirmations` asks for it, WAIT until that many replicas
        have the claim. Sentinel promotes the replica with the most replicated data, so a confirmed
        claim survives a failover. Both go down one connection (a pipeline): WAIT counts replicas
        that acknowledged its own connection's last write."""
        wanted = self.settings.confirmations
        if wanted <= 0:
            return self._claim(keys=keys, args=args)
        pipe = self.redis.pipeline(transaction=False)
        self._claim(keys=keys, args=args, client=pipe)
        pipe.execute_command("WAIT", wanted, self.settings.confirm_ms)
        result, acked = pipe.execute()
        if result[0] == "claimed" and acked < wanted:
            log.warning("event=claim_unconfirmed request_id=%s replicas=%d wanted=%d", rid, acked, wanted)
        return result

    def publish(self, events: list[tuple[str, ReplyEvent, int | None]]) -> Published:
        """Publish and log (channel, event, position) triples whose claim still holds the event's
        epoch, in one round trip. The position is a token's index, or for a last event the count of
        tokens before it (None: not known); publish.lua checks it against the log (a gap: the log
        lost its tail in a failover)."""
        if not events:
            return Published(set(), {})
        script_keys, args = [redis_keys.CLAIMS], [redis_keys.stream_maxlen(self.settings), redis_keys.stream_ttl_s(self.settings)]
        for channel, event, position in events:
            script_keys += [redis_keys.claim(event.request_id), redis_keys.stream(event.request_id)]
            # The log's TTL is refreshed on the first token, every TTL_REFRESH_TOKENS-th and the last
            # event, not on every token: a command per token saved, and the TTL is hours.
            final = "1" if event.type != "token" else "r" if (event.index or 0) % TTL_REFRESH_TOKENS == 0 else "0"
            args += [event.request_id, event.epoch, channel, event.model_dump_json(exclude_none=True), final,
                     "" if position is None else position]
        fenced, gaps = self._publish(keys=script_keys, args=args)
        return Published(set(fenced), {gaps[i]: int(gaps[i + 1]) for i in range(0, len(gaps), 2)})

    def publish_unfenced(self, channel: str, event: ReplyEvent) -> None:
        """For the final word on a request nobody claimed (skipped because it was cancelled)."""
        data = event.model_dump_json(exclude_none=True)
        pipe = self.redis.pipeline(transaction=False)
        pipe.publish(channel, data)
        pipe.xadd(redis_keys.stream(event.request_id), {"event": data}, maxlen=redis_keys.stream_maxlen(self.settings),
                  approximate=True)
        pipe.expire(redis_keys.stream(event.request_id), redis_keys.stream_ttl_s(self.settings))
        pipe.execute()

    def release(self, rid: str, me: str, epoch: int) -> bool:
        return bool(self._release(keys=[redis_keys.claim(rid), redis_keys.CLAIMS, redis_keys.UNCLAIMED], args=[rid, me, epoch, time.time()]))

    def reap(self, rid: str, dead_owner: str) -> str:
        """skip | requeue | buried"""
        outcome, epoch = self._reap(keys=[redis_keys.claim(rid), redis_keys.CLAIMS, redis_keys.UNCLAIMED],
                                    args=[rid, dead_owner, self.max_attempts, time.time()])
        if outcome == BURY:
            return "buried" if self._buried(rid, epoch) else "skip"
        return outcome

    def engage(self, started: dict[str, int]) -> None:
        """These requests (id -> our claim's epoch) start computing in our engine: from now on our
        death counts as one of their attempts (engage.lua; a wait for a row does not)."""
        pipe = self.redis.pipeline(transaction=False)
        for rid, epoch in started.items():
            self._engage(keys=[redis_keys.claim(rid)], args=[epoch], client=pipe)
        pipe.execute()

    def orphaned(self, rid: str, me: str) -> bool:
        """After this worker was fenced on `rid`: does nobody hold it now? True when its claim is
        neither running under another owner, nor queued again, nor ended: a failover lost the claim
        that fenced us out (or ours), so nobody else will run it unless it is queued again. A claim
        in state `queued` was handed back or reaped, and its sender (or the reaper's unclaimed
        sweep) queues it: queued here too, it ran twice, the second copy cancelled mid-stream."""
        state, owner = self.redis.hmget(redis_keys.claim(rid), "state", "owner")
        if state in ("done", "dead", QUEUED) or not self.redis.exists(redis_keys.request(rid)):
            return False
        return not (state == "running" and owner and owner != me)

    def take_unclaimed(self, rid: str, cutoff: float, now: float) -> bool:
        """Whether this caller is to send it again, with `now` as its new unclaimed mark (and its
        message's stamp)."""
        return bool(self._take_unclaimed(keys=[redis_keys.UNCLAIMED, redis_keys.claim(rid), redis_keys.TAKEN],
                                         args=[rid, cutoff, now]))

    def retake(self, rid: str, receiver: str, now: float) -> bool:
        """Whether this caller is to send again a request whose receiver died before claiming it."""
        return bool(self._retake(keys=[redis_keys.TAKEN, redis_keys.claim(rid), redis_keys.UNCLAIMED, redis_keys.request(rid)],
                                 args=[rid, receiver, now]))

    def mark_taken(self, rid: str, me: str) -> None:
        """This worker received the request's message (it may wait in the prefetch before a claim).
        The transport marked it already as the message arrived (workers/transport.py); this second
        mark, from Celery's task_received, covers a worker started without Brigade's transport."""
        self.redis.hset(redis_keys.TAKEN, rid, me)

    def takers(self) -> dict[str, str]:
        """Every request whose message a worker received and has not claimed: request id -> receiver."""
        return self.redis.hgetall(redis_keys.TAKEN)

    def owners(self) -> dict[str, str]:
        """Every running claim: request id -> owner instance."""
        return self.redis.hgetall(redis_keys.CLAIMS)

    def alive(self, instances: set[str]) -> set[str]:
        pipe = self.redis.pipeline(transaction=False)
        ordered = sorted(instances)
        for instance in ordered:
            pipe.exists(redis_keys.worker(instance))
        return {i for i, up in zip(ordered, pipe.execute()) if up}

    def queued_request(self, rid: str) -> QueuedRequest | None:
        raw = self.redis.get(redis_keys.request(rid))
        return QueuedRequest.model_validate_json(raw) if raw else None

    def generated(self, rid: str) -> list[int]:
        """The token ids already delivered for a request, in index order, from its replay log."""
        return [e["token_id"] for e in self.logged_tokens(rid)]

    def logged_tokens(self, rid: str) -> list[dict]:
        """The token events already delivered for a request, in index order, from its replay log
        (an n > 1 request's carry their choice). Only the claim holder calls this, after claiming:
        nobody else can still be writing the log."""
        events: list[dict] = []
        for _, fields in self.redis.xrange(redis_keys.stream(rid)):
            event = json.loads(fields["event"])
            if (event.get("type") == "token" and event.get("index") == len(events)
                    and event.get("token_id") is not None):
                events.append(event)
        return events

    # ---- the dead-letter list (`brigade dlq`) --------------------------------------------------------

    def dead_letters(self) -> list[dict]:
        return [json.loads(raw) for raw in self.redis.lrange(redis_keys.DEAD_LETTERS, 0, -1)]

    def _take_dead_letter(self, rid: str) -> dict | None:
        for raw in self.redis.lrange(redis_keys.DEAD_LETTERS, 0, -1):
            entry = json.loads(raw)
            if entry["request_id"] == rid and self.redis.lrem(redis_keys.DEAD_LETTERS, 1, raw):
                return entry
        return None

    def drop_dead_letter(self, rid: str) -> bool:
        return self._take_dead_letter(rid) is not None

    def retry_dead_letter(self, rid: str) -> QueuedRequest | None:
        """Make a buried request claimable again (attempts from zero), with its progress kept;
        returns it for the caller to queue. Its client may follow it with `resume`."""
        entry = self._take_dead_letter(rid)
        if entry is None or not entry.get("request"):
            return None
        queued = QueuedRequest.model_validate_json(entry["request"])
        pipe = self.redis.pipeline(transaction=True)
        pipe.set(redis_keys.request(rid), entry["request"], ex=redis_keys.request_ttl_s(self.settings))
        pipe.hset(redis_keys.claim(rid), mapping={"state": QUEUED, "owner": "", "attempts": 0})
        pipe.expire(redis_keys.claim(rid), redis_keys.claim_ttl_s(self.settings))
        pipe.zadd(redis_keys.UNCLAIMED, {rid: time.time()})
        pipe.execute()
        # The burial's error event would end a resumed stream early: the request is alive again.
        for entry_id, fields in self.redis.xrange(redis_keys.stream(rid)):
            if json.loads(fields["event"]).get("type") != "token":
                self.redis.xdel(redis_keys.stream(rid), entry_id)
        return queued

