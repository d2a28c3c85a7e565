-- Count a cache hit, only while the entry exists: HINCRBY on an expired entry would recreate its
-- hash without a TTL, and nothing would ever delete it.
-- KEYS: entry, LRU set, stats;  ARGV: entry id, now, counter
if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end
redis.call('HINCRBY', KEYS[1], 'hits', 1)
redis.call('ZADD', KEYS[2], 'XX', ARGV[2], ARGV[1])
redis.call('HINCRBY', KEYS[3], ARGV[3], 1)
return 1
