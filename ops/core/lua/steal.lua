-- An idle worker takes messages routed to busy workers that did not take them in time. The thief
-- saw each source list's oldest message (its tail, popped next) at an earlier look; a message
-- still at the tail now, under the same task id, waited at least that long, and moves to the pop
-- end of the thief's own list (it has waited: it goes first). No clock is compared, only ids.
-- KEYS: the thief's own list, then the source lists;  ARGV: at most how many to move, then for
-- each source the task id expected at its tail ('' to move nothing from it)
-- Returns {moved, then each source's tail task id now ('' when empty)}.
local budget, moved, tails = tonumber(ARGV[1]), 0, {}
local function tail_id(list)
  local raw = redis.call('LINDEX', list, -1)
  if not raw then return '' end
  local ok, msg = pcall(cjson.decode, raw)
  if not ok or type(msg) ~= 'table' or type(msg.headers) ~= 'table' then return '?' end
  return tostring(msg.headers.id or '?')
end
for i = 2, #KEYS do
  -- One message per source per look: the next one at that tail has its own wait to make.
  if moved < budget and ARGV[i] ~= '' and tail_id(KEYS[i]) == ARGV[i] then
    redis.call('RPUSH', KEYS[1], redis.call('RPOP', KEYS[i]))
    moved = moved + 1
  end
  tails[#tails + 1] = tail_id(KEYS[i])
end
local out = {moved}
for _, t in ipairs(tails) do out[#out + 1] = t end
return out
