"""Who runs a request, fenced: the atomic claim, the fenced publish, hand-back, reaping, burial.

A request's claim record (`keys.claim`) holds an epoch that only grows, the owner (a worker
process's instance id), a state and the number of attempts. Every change is one Lua script, so
that it is atomic against every other worker and reaper:

- claim: a worker takes the request unless it is finished, dead, or held by a live owner; the
  epoch goes up and the owner is recorded in `keys.CLAIMS` (the reaper's list).
- publish: a step's events are published and logged only for requests whose claim still carries
  the publisher's epoch; the others come back as fenced, and their worker drops them. So a worker
  that stalled and was taken over can never write into the stream again.
- release (graceful hand-back) and reap (owner's heartbeat expired): the epoch goes up, which
  fences the old owner, and the request is free to be claimed again.
- bury: after max_attempts claims that ended in a crash, the request goes to the dead-letter list.
"""
from __future__ import annotations

import json
import time
from dataclasses import dataclass

import redis

from ops.core import keys
from ops.core.messages import QueuedRequest, ReplyEvent

QUEUED = "queued"  # claim state of a request sent to the queue again (the others live in the scripts)

# Appends a dead-letter entry, ends the claim and tells the client (in the same atomic step, so
# that the burial and its notice cannot come apart); expects KEYS[1] claim, KEYS[2] claims
# index, KEYS[3] request, KEYS[4] dead letters, KEYS[6] stream, and locals rid, attempts,
# reason, now, dlq_max, ttl, maxlen.
_BURY = """
local request = redis.call('GET', KEYS[3]) or ''
local entry = cjson.encode({request_id = rid, attempts = attempts, reason = reason, at = tonumber(now),
                            request = request})
redis.call('HSET', KEYS[1], 'state', 'dead', 'owner', '')
redis.call('HDEL', KEYS[2], rid)
redis.call('LPUSH', KEYS[4], entry)
redis.call('LTRIM', KEYS[4], 0, tonumber(dlq_max) - 1)
if request ~= '' then
  local notice = cjson.encode({type = 'error', request_id = rid, code = 'worker_failed',
    message = 'this request crashed ' .. attempts .. ' workers and was set aside (dead-letter list); ' ..
              'it will not be retried automatically'})
  redis.call('PUBLISH', cjson.decode(request).reply_channel, notice)
  redis.call('XADD', KEYS[6], 'MAXLEN', '~', maxlen, '*', 'event', notice)
  redis.call('EXPIRE', KEYS[6], ttl)
end
"""

# KEYS: claim, claims index, request, dead letters, unclaimed, stream, taken
# ARGV: rid, me, max_attempts, worker key prefix, ttl, now, dlq_max, stream maxlen
_CLAIM = """
local rid, me, max_attempts, prefix, ttl, now, dlq_max = ARGV[1], ARGV[2], tonumber(ARGV[3]), ARGV[4], ARGV[5], ARGV[6], ARGV[7]
local maxlen = ARGV[8]
redis.call('ZREM', KEYS[5], rid)
-- Who received the message matters only until someone claims it (a later resend is a new message).
redis.call('DEL', KEYS[7])
if redis.call('EXISTS', KEYS[3]) == 0 then return {'gone', 0, 0} end
local c = redis.call('HMGET', KEYS[1], 'state', 'owner', 'attempts')
local state, owner, attempts = c[1], c[2], tonumber(c[3] or '0')
if state == 'done' or state == 'dead' then return {state, 0, attempts} end
if state == 'running' and owner and owner ~= '' then
  if owner == me or redis.call('EXISTS', prefix .. owner) == 1 then return {'busy', 0, attempts} end
end
if attempts >= max_attempts then
  local reason = 'crashed ' .. attempts .. ' workers'
""" + _BURY + """
  return {'dead', 0, attempts}
end
local epoch = redis.call('HINCRBY', KEYS[1], 'epoch', 1)
redis.call('HSET', KEYS[1], 'state', 'running', 'owner', me, 'attempts', attempts + 1)
redis.call('EXPIRE', KEYS[1], ttl)
redis.call('HSET', KEYS[2], rid, me)
return {'claimed', epoch, attempts + 1}
"""

# KEYS[1] claims index, then per event: claim, stream
# ARGV[1] stream maxlen, ARGV[2] stream ttl, then per event: rid, epoch, channel, data, and
# final ('1': the request's last event; 'r': a token that refreshes the log's TTL; '0': a token)
_PUBLISH = """
local fenced = {}
local n = (#KEYS - 1) / 2
for i = 1, n do
  local claim, stream = KEYS[2 * i], KEYS[2 * i + 1]
  local a = 2 + (i - 1) * 5
  local rid, epoch, channel, data, final = ARGV[a + 1], ARGV[a + 2], ARGV[a + 3], ARGV[a + 4], ARGV[a + 5]
  local c = redis.call('HMGET', claim, 'epoch', 'state')
  if c[1] ~= epoch or c[2] ~= 'running' then
    table.insert(fenced, rid)
  else
    redis.call('PUBLISH', channel, data)
    redis.call('XADD', stream, 'MAXLEN', '~', ARGV[1], '*', 'event', data)
    if final ~= '0' then redis.call('EXPIRE', stream, ARGV[2]) end
    if final == '1' then
      redis.call('HSET', claim, 'state', 'done', 'owner', '')
      redis.call('HDEL', KEYS[1], rid)
    end
  end
end
return fenced
"""

# KEYS: claim, claims index, unclaimed;  ARGV: rid, me, epoch, now
_RELEASE = """
local c = redis.call('HMGET', KEYS[1], 'owner', 'epoch', 'state')
if c[1] ~= ARGV[2] or c[2] ~= ARGV[3] or c[3] ~= 'running' then return 0 end
redis.call('HINCRBY', KEYS[1], 'epoch', 1)
redis.call('HINCRBY', KEYS[1], 'attempts', -1)  -- a hand-back is not a crash
redis.call('HSET', KEYS[1], 'state', 'queued', 'owner', '')
redis.call('HDEL', KEYS[2], ARGV[1])
redis.call('ZADD', KEYS[3], ARGV[4], ARGV[1])
return 1
"""

# KEYS: claim, claims index, request, dead letters, unclaimed, stream, (taken)
# ARGV: rid, presumed-dead owner, max_attempts, now, dlq_max, ttl, stream maxlen
_REAP = """
local rid, dead_owner, max_attempts, now, dlq_max = ARGV[1], ARGV[2], tonumber(ARGV[3]), ARGV[4], ARGV[5]
local ttl, maxlen = ARGV[6], ARGV[7]
local c = redis.call('HMGET', KEYS[1], 'owner', 'state', 'attempts')
if c[1] ~= dead_owner or c[2] ~= 'running' then
  if redis.call('HGET', KEYS[2], rid) == dead_owner then redis.call('HDEL', KEYS[2], rid) end
  return 'skip'
end
redis.call('HINCRBY', KEYS[1], 'epoch', 1)
local attempts = tonumber(c[3] or '0')
if attempts >= max_attempts then
  local reason = 'crashed ' .. attempts .. ' workers'
""" + _BURY + """
  return 'buried'
end
redis.call('HSET', KEYS[1], 'state', 'queued', 'owner', '')
redis.call('HDEL', KEYS[2], rid)
redis.call('ZADD', KEYS[5], now, rid)
return 'requeue'
"""


# KEYS: unclaimed, claim, taken;  ARGV: rid, cutoff, now. One reaper wins the right to send it
# again. A claim record in state 'queued' (reaped or handed back, sent again) may be lost the same way.
_TAKE_UNCLAIMED = """
local state = redis.call('HGET', KEYS[2], 'state')
if state and state ~= 'queued' then redis.call('ZREM', KEYS[1], ARGV[1]) return 0 end
local since = redis.call('ZSCORE', KEYS[1], ARGV[1])
if not since or tonumber(since) > tonumber(ARGV[2]) then return 0 end
redis.call('ZADD', KEYS[1], ARGV[3], ARGV[1])
redis.call('DEL', KEYS[3])  -- the dead receiver's mark belongs to the message given up on
return 1
"""


TTL_REFRESH_TOKENS = 32


@dataclass(frozen=True)
class Claim:
    outcome: str  # claimed | busy | done | dead | gone
    epoch: int
    attempts: int


class ClaimStore:
    """Over a client without decode_responses: replies are bytes."""

    def __init__(self, client: redis.Redis, stream_maxlen: int, stream_ttl_s: int, max_attempts: int, dlq_max: int):
        self.redis = client
        self.stream_maxlen = stream_maxlen
        self.ttl = stream_ttl_s
        self.max_attempts = max_attempts
        self.dlq_max = dlq_max
        self._claim = client.register_script(_CLAIM)
        self._publish = client.register_script(_PUBLISH)
        self._release = client.register_script(_RELEASE)
        self._reap = client.register_script(_REAP)
        self._take_unclaimed = client.register_script(_TAKE_UNCLAIMED)

    @classmethod
    def from_settings(cls, client: redis.Redis, settings) -> "ClaimStore":
        return cls(client, settings.stream_maxlen, settings.stream_ttl_s, settings.max_attempts, settings.dlq_max)

    def _keys(self, rid: str) -> list[str]:
        return [keys.claim(rid), keys.CLAIMS, keys.request(rid), keys.DEAD_LETTERS, keys.UNCLAIMED, keys.stream(rid),
                keys.taken(rid)]

    def claim(self, rid: str, me: str) -> Claim:
        outcome, epoch, attempts = self._claim(
            keys=self._keys(rid),
            args=[rid, me, self.max_attempts, keys.WORKER_PREFIX, self.ttl, time.time(), self.dlq_max,
                  self.stream_maxlen],
        )
        return Claim(as_text(outcome), int(epoch), int(attempts))

    def publish(self, events: list[tuple[str, ReplyEvent]]) -> set[str]:
        """Publish and log (channel, event) pairs whose claim still holds the event's epoch, in one
        round trip. Returns the request ids that were fenced (their events went nowhere)."""
        if not events:
            return set()
        script_keys, args = [keys.CLAIMS], [self.stream_maxlen, self.ttl]
        for channel, event in events:
            script_keys += [keys.claim(event.request_id), keys.stream(event.request_id)]
            # The log's TTL is refreshed on the first token, every TTL_REFRESH_TOKENS-th and the last
            # event, not on every token: a command per token saved, and the TTL is hours.
            final = "1" if event.type != "token" else "r" if (event.index or 0) % TTL_REFRESH_TOKENS == 0 else "0"
            args += [event.request_id, event.epoch, channel, event.model_dump_json(exclude_none=True), final]
        return {as_text(r) for r in self._publish(keys=script_keys, args=args)}

    def publish_unfenced(self, channel: str, event: ReplyEvent) -> None:
        """For the final word on a request nobody claimed (skipped because it was cancelled)."""
        data = event.model_dump_json(exclude_none=True)
        pipe = self.redis.pipeline(transaction=False)
        pipe.publish(channel, data)
        pipe.xadd(keys.stream(event.request_id), {"event": data}, maxlen=self.stream_maxlen, approximate=True)
        pipe.expire(keys.stream(event.request_id), self.ttl)
        pipe.execute()

    def release(self, rid: str, me: str, epoch: int) -> bool:
        return bool(self._release(keys=[keys.claim(rid), keys.CLAIMS, keys.UNCLAIMED], args=[rid, me, epoch, time.time()]))

    def reap(self, rid: str, dead_owner: str) -> str:
        """skip | requeue | buried"""
        return as_text(self._reap(keys=self._keys(rid), args=[rid, dead_owner, self.max_attempts, time.time(),
                                                             self.dlq_max, self.ttl, self.stream_maxlen]))

    def take_unclaimed(self, rid: str, cutoff: float) -> bool:
        return bool(self._take_unclaimed(keys=[keys.UNCLAIMED, keys.claim(rid), keys.taken(rid)],
                                         args=[rid, cutoff, time.time()]))

    def mark_taken(self, rid: str, me: str) -> None:
        """This worker received the request's message (it may wait in the prefetch before a claim)."""
        self.redis.set(keys.taken(rid), me, ex=self.ttl)

    def owners(self) -> dict[str, str]:
        """Every running claim: request id -> owner instance."""
        return {as_text(k): as_text(v) for k, v in self.redis.hgetall(keys.CLAIMS).items()}

    def alive(self, instances: set[str]) -> set[str]:
        pipe = self.redis.pipeline(transaction=False)
        ordered = sorted(instances)
        for instance in ordered:
            pipe.exists(keys.worker(instance))
        return {i for i, up in zip(ordered, pipe.execute()) if up}

    def queued_request(self, rid: str) -> QueuedRequest | None:
        raw = self.redis.get(keys.request(rid))
        return QueuedRequest.model_validate_json(raw) if raw else None

    def generated(self, rid: str) -> list[int]:
        """The token ids already delivered for a request, in index order, from its replay log. Only
        the claim holder calls this, after claiming: nobody else can still be writing the log."""
        ids: list[int] = []
        for _, fields in self.redis.xrange(keys.stream(rid)):
            event = json.loads(fields[b"event"])
            if event.get("type") == "token" and event.get("index") == len(ids) and event.get("token_id") is not None:
                ids.append(event["token_id"])
        return ids

    # ---- the dead-letter list (`brigade dlq`) --------------------------------------------------------

    def dead_letters(self) -> list[dict]:
        return [json.loads(raw) for raw in self.redis.lrange(keys.DEAD_LETTERS, 0, -1)]

    def _take_dead_letter(self, rid: str) -> dict | None:
        for raw in self.redis.lrange(keys.DEAD_LETTERS, 0, -1):
            entry = json.loads(raw)
            if entry["request_id"] == rid and self.redis.lrem(keys.DEAD_LETTERS, 1, raw):
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
        pipe.set(keys.request(rid), entry["request"], ex=self.ttl)
        pipe.hset(keys.claim(rid), mapping={"state": QUEUED, "owner": "", "attempts": 0})
        pipe.expire(keys.claim(rid), self.ttl)
        pipe.zadd(keys.UNCLAIMED, {rid: time.time()})
        pipe.execute()
        # The burial's error event would end a resumed stream early: the request is alive again.
        for entry_id, fields in self.redis.xrange(keys.stream(rid)):
            if json.loads(fields[b"event"]).get("type") != "token":
                self.redis.xdel(keys.stream(rid), entry_id)
        return queued


def as_text(value) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
