-- A step's events, published and logged only for requests whose claim still carries the
-- publisher's epoch; the others come back as fenced, and their worker drops them. So a worker
-- that stalled and was taken over can never write into the stream again.
-- Tokens enter the log in index order, each once: the claim's `logged` counts the tokens logged.
-- An event whose position is beyond it means the log lost its tail (a Sentinel failover promoted
-- a replica that lacked the last writes; replication is asynchronous): that request's events stop
-- here and it comes back as a gap, with `logged`, so that its worker sends the missing events
-- again from its own memory. A token already logged (a resend meeting a live one) is skipped.
-- KEYS[1] claims index, then per event: claim, stream
-- ARGV[1] stream maxlen, ARGV[2] stream ttl, then per event: rid, epoch, channel, data, final
-- ('1': the request's last event; 'r': a token that refreshes the log's TTL; '0': a token), and
-- position (a token's index; for a last event, the count of tokens before it; '' for none known)
-- Returns {fenced request ids, gaps as rid, logged, rid, logged, ...}.
local fenced, gaps, stopped = {}, {}, {}
local n = (#KEYS - 1) / 2
for i = 1, n do
  local claim, stream = KEYS[2 * i], KEYS[2 * i + 1]
  local a = 2 + (i - 1) * 6
  local rid, epoch, channel, data, final, position = ARGV[a + 1], ARGV[a + 2], ARGV[a + 3], ARGV[a + 4],
    ARGV[a + 5], tonumber(ARGV[a + 6])
  if not stopped[rid] then
    local c = redis.call('HMGET', claim, 'epoch', 'state', 'logged')
    -- No count yet: the request's first publish, or a claim written before the count existed (a
    -- rolling upgrade); the count starts here rather than calling every earlier token missing.
    local logged = tonumber(c[3] or (position or 0))
    if c[1] ~= epoch or c[2] ~= 'running' then
      table.insert(fenced, rid)
      stopped[rid] = true
    elseif position and position > logged then
      table.insert(gaps, rid)
      table.insert(gaps, logged)
      stopped[rid] = true
    elseif not (position and final ~= '1' and position < logged) then
      redis.call('PUBLISH', channel, data)
      redis.call('XADD', stream, 'MAXLEN', '~', ARGV[1], '*', 'event', data)
      if final ~= '1' and position then redis.call('HSET', claim, 'logged', position + 1) end
      if final ~= '0' then redis.call('EXPIRE', stream, ARGV[2]) end
      if final == '1' then
        redis.call('HSET', claim, 'state', 'done', 'owner', '')
        redis.call('HDEL', KEYS[1], rid)
      end
    end
  end
end
return {fenced, gaps}
