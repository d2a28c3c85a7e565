-- An idle worker takes messages routed to busy workers that did not take them in time. The thief
-- saw each source list's oldest message (its tail, popped next) at an earlier look; a message
-- still at the tail now, under the same task id, waited at least that long, and moves to the pop
-- end of the thief's own list of the same priority step (it has waited: it goes first). No clock
-- is compared, only ids; one message per source per look (the next has its own wait to make).
-- KEYS: pairs of (the thief's own list, a source list of the same step)
-- ARGV: at most how many to move, then for each pair the task id expected at the source's tail
--       ('' to move nothing from it)
-- Returns {moved, then each source's tail task id now ('' when empty)}.
local budget, moved, out = tonumber(ARGV[1]), 0, {0}
local function tail_id(list)
  local raw = redis.call('LINDEX', list, -1)
  if not raw then return '' end
  local ok, msg = pcall(cjson.decode, raw)
  if not ok or type(msg) ~= 'table' or type(msg.headers) ~= 'table' then return '?' end
  return tostring(msg.headers.id or '?')
end
for pair = 1, #KEYS / 2 do
  local own, source, expected = KEYS[2 * pair - 1], KEYS[2 * pair], ARGV[pair + 1]
  if moved < budget and expected ~= '' and tail_id(source) == expected then
    redis.call('RPUSH', own, redis.call('RPOP', source))
    moved = moved + 1
  end
  out[#out + 1] = tail_id(source)
end
out[1] = moved
return out
