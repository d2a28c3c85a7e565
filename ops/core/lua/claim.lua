-- A worker claims a request: unless it is finished, dead, or held by a live owner, the epoch goes
-- up and the worker becomes its owner. After max_attempts claims that ended in a crash, the
-- request is buried instead: a dead-letter entry, the claim ended and the client told, in this
-- same atomic step so that the burial and its notice cannot come apart (reap.lua buries alike).
-- KEYS: claim, claims index, request, dead letters, unclaimed, stream, taken, and the heartbeat
--       key of the owner the caller read from the claim (any key when it read none)
-- ARGV: rid, me, max_attempts, claim ttl, now, dlq_max, stream maxlen, stream ttl, presumed owner
-- Returns {outcome, epoch, attempts}; outcome 'moved' when the owner is not the one presumed:
-- the caller reads it again and retries (its heartbeat key is known only once the owner is).
local rid, me, max_attempts, ttl, now = ARGV[1], ARGV[2], tonumber(ARGV[3]), ARGV[4], ARGV[5]
local dlq_max, maxlen, stream_ttl, presumed = ARGV[6], ARGV[7], ARGV[8], ARGV[9]
local c = redis.call('HMGET', KEYS[1], 'state', 'owner', 'attempts')
local state, owner, attempts = c[1], c[2], tonumber(c[3] or '0')
local held = state == 'running' and owner and owner ~= '' and owner ~= me
if held and owner ~= presumed then return {'moved', 0, attempts} end
redis.call('ZREM', KEYS[5], rid)
-- Who received the message matters only until someone claims it (a later resend is a new message).
redis.call('DEL', KEYS[7])
if redis.call('EXISTS', KEYS[3]) == 0 then return {'gone', 0, 0} end
if state == 'done' or state == 'dead' then return {state, 0, attempts} end
if state == 'running' and owner and owner ~= '' then
  if owner == me or redis.call('EXISTS', KEYS[8]) == 1 then return {'busy', 0, attempts} end
end
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
  return {'dead', 0, attempts}
end
local epoch = redis.call('HINCRBY', KEYS[1], 'epoch', 1)
redis.call('HSET', KEYS[1], 'state', 'running', 'owner', me, 'attempts', attempts + 1)
redis.call('EXPIRE', KEYS[1], ttl)
redis.call('HSET', KEYS[2], rid, me)
return {'claimed', epoch, attempts + 1}
