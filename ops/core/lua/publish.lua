-- A step's events, published and logged only for requests whose claim still carries the
-- publisher's epoch; the others come back as fenced, and their worker drops them. So a worker
-- that stalled and was taken over can never write into the stream again.
-- KEYS[1] claims index, then per event: claim, stream
-- ARGV[1] stream maxlen, ARGV[2] stream ttl, then per event: rid, epoch, channel, data, and
-- final ('1': the request's last event; 'r': a token that refreshes the log's TTL; '0': a token)
-- Returns the fenced request ids.
local fenced = {}
local n = (#KEYS - 1) / 2
for i = 1, n do
  local claim, stream = KEYS[2 * i], KEYS[2 * i + 1]
  local a = 2 + (i - 1) * 5
  local rid, epoch, channel, data, final = ARGV[a + 1], ARGV[a + 2], ARGV[a + 3], ARGV[a + 4], ARGV[a + 5]
  local c = redis.call('HMGET', claim, 'epoch', 'state')
  if c[1] ~= epoch or c[2] ~= 'running' then
    table.insert(fenced, rid)
  else
    redis.call('PUBLISH', channel, data)
    redis.call('XADD', stream, 'MAXLEN', '~', ARGV[1], '*', 'event', data)
    if final ~= '0' then redis.call('EXPIRE', stream, ARGV[2]) end
    if final == '1' then
      redis.call('HSET', claim, 'state', 'done', 'owner', '')
      redis.call('HDEL', KEYS[1], rid)
    end
  end
end
return fenced
