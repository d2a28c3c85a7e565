-- The reaper takes a request back from an owner whose heartbeat expired: the epoch goes up, which
-- fences the old owner, and the request is free to be claimed again; after max_attempts claims
-- that crashed while it was computed the answer is 'bury' instead, with the new epoch, for bury.lua.
-- KEYS: claim, claims index, unclaimed
-- ARGV: rid, presumed-dead owner, max_attempts, now
-- Returns {skip | requeue | bury, epoch}.
local rid, dead_owner, max_attempts, now = ARGV[1], ARGV[2], tonumber(ARGV[3]), ARGV[4]
local c = redis.call('HMGET', KEYS[1], 'owner', 'state', 'attempts', 'epoch', 'engaged')
if c[1] ~= dead_owner or c[2] ~= 'running' then
  if redis.call('HGET', KEYS[2], rid) == dead_owner then redis.call('HDEL', KEYS[2], rid) end
  return {'skip', ''}
end
-- The epoch is at least the primary's clock in milliseconds, not only the last epoch + 1: should a
-- Sentinel failover lose the last raise (replication is asynchronous), the next raise is still
-- above every epoch handed out before, so no epoch is ever issued twice or goes backwards.
local t = redis.call('TIME')
local epoch = math.max(tonumber(c[4] or '0') + 1, tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000))
redis.call('HSET', KEYS[1], 'epoch', string.format('%d', epoch))
-- A run that never reached the engine's compute (it waited for a row in a worker that died) is
-- no sign of a poisonous request: its death costs no attempt (engage.lua marks a run that did).
local attempts = tonumber(c[3] or '0')
if c[5] ~= '1' and attempts > 0 then
  attempts = attempts - 1
  redis.call('HSET', KEYS[1], 'attempts', attempts)
end
if attempts >= max_attempts then return {'bury', string.format('%d', epoch)} end
redis.call('HSET', KEYS[1], 'state', 'queued', 'owner', '')
redis.call('HDEL', KEYS[2], rid)
redis.call('ZADD', KEYS[3], now, rid)
return {'requeue', string.format('%d', epoch)}
