-- Admit one request of an API key, or say which limit refuses it (gateway/limits.py explains the
-- three limits). Writes only when it admits: a refused request consumes nothing.
-- KEYS: requests log, token charges, token total, in flight
-- ARGV: now (empty: Redis's clock), window_s, window_ms, rpm, tpm, max_concurrent, request id, stale_s, stale_ms
-- Returns nil when admitted (and recorded), else {limit, retry_after_s, used}.
local now, window, window_ms = tonumber(ARGV[1]), tonumber(ARGV[2]), ARGV[3]
if not now then
  -- Redis's own clock: one clock for every gateway, and scores in the order the scripts run
  local t = redis.call('TIME')
  now = tonumber(t[1]) + tonumber(t[2]) / 1000000
end
local rpm, tpm, max_concurrent = tonumber(ARGV[4]), tonumber(ARGV[5]), tonumber(ARGV[6])
local rid, stale, stale_ms = ARGV[7], tonumber(ARGV[8]), ARGV[9]
local since = now - window

-- Forget what left the window; a member scored exactly `since` has left it.
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', since)
local gone = redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', since)
if #gone > 0 then
  local freed = 0
  for _, charge in ipairs(gone) do freed = freed + tonumber(string.match(charge, '^(%d+):')) end
  redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', since)
  local ttl = redis.call('PTTL', KEYS[2])
  if ttl == -2 then
    redis.call('DEL', KEYS[3])  -- no charge left in the window
  else
    if ttl < 0 then ttl = window_ms; redis.call('PEXPIRE', KEYS[2], ttl) end
    redis.call('DECRBY', KEYS[3], freed)
    redis.call('PEXPIRE', KEYS[3], ttl)  -- the two expire together, whatever happened before
  end
end
redis.call('ZREMRANGEBYSCORE', KEYS[4], '-inf', now - stale)

local limit, wait, used = '', 0, 0
if rpm > 0 then
  local n = redis.call('ZCARD', KEYS[1])
  if n >= rpm then
    -- the admission that must leave the window for one more to fit
    local leaving = redis.call('ZRANGE', KEYS[1], n - rpm, n - rpm, 'WITHSCORES')
    limit, wait, used = 'rpm', tonumber(leaving[2]) + window - now, n
  end
end
if tpm > 0 then
  local total = tonumber(redis.call('GET', KEYS[3]) or '0')
  if total >= tpm then
    -- walk the charges oldest first until what stays in the window is under the limit
    local charges = redis.call('ZRANGE', KEYS[2], 0, -1, 'WITHSCORES')
    local left, at = total, now
    for i = 1, #charges, 2 do
      left = left - tonumber(string.match(charges[i], '^(%d+):'))
      if left < tpm then at = tonumber(charges[i + 1]); break end
    end
    local w = at + window - now
    if limit == '' or w > wait then limit, wait, used = 'tpm', w, total end
  end
end
if max_concurrent > 0 then
  local n = redis.call('ZCARD', KEYS[4])
  if n >= max_concurrent and (limit == '' or wait < 1) then limit, wait, used = 'max_concurrent', 1, n end
end
if limit ~= '' then return {limit, tostring(wait), tostring(used)} end

if rpm > 0 then
  redis.call('ZADD', KEYS[1], now, rid)
  redis.call('PEXPIRE', KEYS[1], window_ms)
end
if max_concurrent > 0 then
  redis.call('ZADD', KEYS[4], now, rid)
  redis.call('PEXPIRE', KEYS[4], stale_ms)
end
return false
