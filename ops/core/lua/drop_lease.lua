-- A batch runner gives its job's lease up, only if it still holds it.
-- KEYS: lease;  ARGV: holder.  Returns 1 when dropped.
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
