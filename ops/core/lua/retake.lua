-- One reaper wins the right to send again a request whose message a worker received (`taken`)
-- and then died before claiming it: only while the mark still names that receiver (a claim, or
-- another reaper, removed it first otherwise), and only while nobody runs or ended it.
-- KEYS: taken (hash), claim, unclaimed, request;  ARGV: rid, receiver, now
-- Returns 1 when this caller is to send it again.
local rid = ARGV[1]
if redis.call('HGET', KEYS[1], rid) ~= ARGV[2] then return 0 end
redis.call('HDEL', KEYS[1], rid)
if redis.call('EXISTS', KEYS[4]) == 0 then redis.call('ZREM', KEYS[3], rid) return 0 end
local state = redis.call('HGET', KEYS[2], 'state')
if state and state ~= 'queued' then return 0 end
redis.call('ZADD', KEYS[3], ARGV[3], rid)
return 1
