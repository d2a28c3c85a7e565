-- Bury a request that crashed max_attempts workers: a dead-letter entry, the claim ended and the
-- client told, in one atomic step so that the burial and its notice cannot come apart. claim.lua
-- and reap.lua decide it (answering 'bury' with the claim's epoch); this buries only if the claim
-- is still as they saw it, so that two deciders bury it once.
-- KEYS: claim, claims index, request, dead letters, stream
-- ARGV: rid, epoch seen by the decider ('' for none), max_attempts, now, dlq_max, stream maxlen, stream ttl
-- Returns 1 when buried here, 0 when the claim moved on (buried by another, retried, ...).
local rid, seen, max_attempts, now, dlq_max = ARGV[1], ARGV[2], tonumber(ARGV[3]), ARGV[4], ARGV[5]
local maxlen, stream_ttl = ARGV[6], ARGV[7]
local c = redis.call('HMGET', KEYS[1], 'epoch', 'state', 'attempts')
local attempts = tonumber(c[3] or '0')
if (c[1] or '') ~= seen or c[2] == 'done' or c[2] == 'dead' or attempts < max_attempts then return 0 end
local request = redis.call('GET', KEYS[3]) or ''
local entry = cjson.encode({request_id = rid, attempts = attempts, reason = 'crashed ' .. attempts .. ' workers',
                            at = tonumber(now), request = request})
redis.call('HSET', KEYS[1], 'state', 'dead', 'owner', '')
redis.call('HDEL', KEYS[2], rid)
redis.call('LPUSH', KEYS[4], entry)
redis.call('LTRIM', KEYS[4], 0, tonumber(dlq_max) - 1)
if request ~= '' then
  local notice = cjson.encode({type = 'error', request_id = rid, code = 'worker_failed',
    message = 'this request crashed ' .. attempts .. ' workers and was set aside (dead-letter list); ' ..
              'it will not be retried automatically'})
  redis.call('PUBLISH', cjson.decode(request).reply_channel, notice)
  redis.call('XADD', KEYS[5], 'MAXLEN', '~', maxlen, '*', 'event', notice)
  redis.call('EXPIRE', KEYS[5], stream_ttl)
end
return 1
