-- A worker's engine starts computing a request (its first prefill chunk in this run): from now on
-- a death of this worker may be the request's doing, and counts as an attempt (reap.lua,
-- claim.lua). Runs that only waited for a row cost none: a line that sat in three workers that
-- were killed for other reasons was buried as poison.
-- KEYS: claim;  ARGV: epoch of the caller's claim
-- Returns 1 when marked, 0 when the claim is no longer the caller's (fenced).
local c = redis.call('HMGET', KEYS[1], 'epoch', 'state')
if c[1] ~= ARGV[1] or c[2] ~= 'running' then return 0 end
redis.call('HSET', KEYS[1], 'engaged', '1')
return 1
