-- A batch runner writes its job's record, only while it holds the job's lease: the fence that keeps
-- a runner which lost the lease (stalled past its TTL, or a failover lost it) from moving a record
-- that another runner now writes.
-- KEYS: lease, job;  ARGV: holder, then field, value pairs.
-- Returns 1 when written, 0 when the lease is not the holder's, -1 when the job's record is gone
-- (an HSET would make it again, without its TTL).
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
if redis.call('EXISTS', KEYS[2]) == 0 then return -1 end
redis.call('HSET', KEYS[2], unpack(ARGV, 2))
return 1
