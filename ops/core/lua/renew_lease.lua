-- A batch runner renews its job's lease, only while it still holds it.
-- KEYS: lease;  ARGV: holder, ttl seconds.  Returns 1 when renewed.
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('EXPIRE', KEYS[1], ARGV[2]) end
return 0
