-- One reaper wins the right to send again a request that waited unclaimed since before the
-- cutoff (its receiver died before claiming it). A claim record in state 'queued' (reaped or
-- handed back, sent again) may be lost the same way.
-- KEYS: unclaimed, claim, taken (hash);  ARGV: rid, cutoff, now
-- Returns 1 when this caller is to send it again.
local state = redis.call('HGET', KEYS[2], 'state')
if state and state ~= 'queued' then redis.call('ZREM', KEYS[1], ARGV[1]) return 0 end
local since = redis.call('ZSCORE', KEYS[1], ARGV[1])
if not since or tonumber(since) > tonumber(ARGV[2]) then return 0 end
redis.call('ZADD', KEYS[1], ARGV[3], ARGV[1])
redis.call('HDEL', KEYS[3], ARGV[1])  -- the dead receiver's mark belongs to the message given up on
return 1
