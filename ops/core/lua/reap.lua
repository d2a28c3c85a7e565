-- The reaper takes a request back from an owner whose heartbeat expired: the epoch goes up, which
-- fences the old owner, and the request is free to be claimed again; after max_attempts crashed
-- claims it is buried instead (the same burial as claim.lua's, atomic with the decision).
-- KEYS: claim, claims index, request, dead letters, unclaimed, stream
-- ARGV: rid, presumed-dead owner, max_attempts, now, dlq_max, stream ttl, stream maxlen
-- Returns skip | requeue | buried.
local rid, dead_owner, max_attempts, now, dlq_max = ARGV[1], ARGV[2], tonumber(ARGV[3]), ARGV[4], ARGV[5]
local stream_ttl, maxlen = ARGV[6], ARGV[7]
local c = redis.call('HMGET', KEYS[1], 'owner', 'state', 'attempts')
if c[1] ~= dead_owner or c[2] ~= 'running' then
  if redis.call('HGET', KEYS[2], rid) == dead_owner then redis.call('HDEL', KEYS[2], rid) end
  return 'skip'
end
redis.call('HINCRBY', KEYS[1], 'epoch', 1)
local attempts = tonumber(c[3] or '0')
if attempts >= max_attempts then
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
    redis.call('XADD', KEYS[6], 'MAXLEN', '~', maxlen, '*', 'event', notice)
    redis.call('EXPIRE', KEYS[6], stream_ttl)
  end
  return 'buried'
end
redis.call('HSET', KEYS[1], 'state', 'queued', 'owner', '')
redis.call('HDEL', KEYS[2], rid)
redis.call('ZADD', KEYS[5], now, rid)
return 'requeue'
