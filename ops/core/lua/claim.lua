-- A worker claims a request: unless it is finished, dead, or held by a live owner, the epoch goes
-- up and the worker becomes its owner. A claim the caller already holds is answered 'mine', with
-- its epoch: a claim whose reply a failover lost finds itself when it is sent again, and only the
-- caller knows whether one of its threads runs the request (a second delivery) or none does. After max_attempts claims that ended in a crash while the
-- request was being computed it is not claimed: the answer is 'bury', with the claim's epoch, for
-- bury.lua.
-- KEYS: claim, claims index, request, unclaimed, taken (hash), and the heartbeat key of the owner the
--       caller read from the claim (any key when it read none)
-- ARGV: rid, me, max_attempts, claim ttl, presumed owner
-- Returns {outcome, epoch, attempts}; outcome 'moved' when the owner is not the one presumed:
-- the caller reads it again and retries (its heartbeat key is known only once the owner is).
local rid, me, max_attempts, ttl, presumed = ARGV[1], ARGV[2], tonumber(ARGV[3]), ARGV[4], ARGV[5]
local c = redis.call('HMGET', KEYS[1], 'state', 'owner', 'attempts', 'epoch', 'engaged')
local state, owner, attempts = c[1], c[2], tonumber(c[3] or '0')
local held = state == 'running' and owner and owner ~= '' and owner ~= me
if held and owner ~= presumed then return {'moved', 0, attempts} end
redis.call('ZREM', KEYS[4], rid)
-- Who received the message matters only until someone claims it (a later resend is a new message).
redis.call('HDEL', KEYS[5], rid)
if redis.call('EXISTS', KEYS[3]) == 0 then return {'gone', 0, 0} end
if state == 'done' or state == 'dead' then return {state, 0, attempts} end
if state == 'running' and owner and owner ~= '' then
  if owner == me then return {'mine', c[4] or '0', attempts} end
  if redis.call('EXISTS', KEYS[6]) == 1 then return {'busy', 0, attempts} end
end
-- Taking over from a dead owner whose run never reached the engine's compute (it waited for a
-- row): that death was not this request's doing, and costs it no attempt (engage.lua).
if state == 'running' and c[5] ~= '1' and attempts > 0 then
  attempts = attempts - 1
  redis.call('HSET', KEYS[1], 'attempts', attempts)
end
if attempts >= max_attempts then return {'bury', c[4] or '', attempts} end
-- The epoch is at least the primary's clock in milliseconds, not only the last epoch + 1: should a
-- Sentinel failover lose the last raise (replication is asynchronous), the next raise is still
-- above every epoch handed out before, so no epoch is ever issued twice or goes backwards.
local t = redis.call('TIME')
local epoch = math.max(tonumber(c[4] or '0') + 1, tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000))
redis.call('HSET', KEYS[1], 'epoch', string.format('%d', epoch))
redis.call('HSET', KEYS[1], 'state', 'running', 'owner', me, 'attempts', attempts + 1)
redis.call('HDEL', KEYS[1], 'engaged')  -- this run has computed nothing yet
redis.call('EXPIRE', KEYS[1], ttl)
redis.call('HSET', KEYS[2], rid, me)
return {'claimed', string.format('%d', epoch), attempts + 1}
