-- A worker hands a request back (graceful drain): the epoch goes up, which fences it, and the
-- request waits to be claimed again. A hand-back is not a crash: it costs no attempt.
-- KEYS: claim, claims index, unclaimed;  ARGV: rid, me, epoch, now
-- Returns 1 when handed back, 0 when the claim was no longer this worker's.
local c = redis.call('HMGET', KEYS[1], 'owner', 'epoch', 'state')
if c[1] ~= ARGV[2] or c[2] ~= ARGV[3] or c[3] ~= 'running' then return 0 end
-- The epoch is at least the primary's clock in milliseconds, not only the last epoch + 1: should a
-- Sentinel failover lose the last raise (replication is asynchronous), the next raise is still
-- above every epoch handed out before, so no epoch is ever issued twice or goes backwards.
local t = redis.call('TIME')
local epoch = math.max(tonumber(c[2] or '0') + 1, tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000))
redis.call('HSET', KEYS[1], 'epoch', string.format('%d', epoch))
redis.call('HINCRBY', KEYS[1], 'attempts', -1)
redis.call('HSET', KEYS[1], 'state', 'queued', 'owner', '')
redis.call('HDEL', KEYS[2], ARGV[1])
redis.call('ZADD', KEYS[3], ARGV[4], ARGV[1])
return 1
