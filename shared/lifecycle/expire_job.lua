-- Prepended to the scripts that end a job. Once a job ends, every key it made expires after
-- the retention period. Expects KEYS[1..3] to be the job's record, stream and cancel key. The
-- idempotency key's name is read from the record: single-instance Redis, not Redis Cluster.
local function expire_job(retention)
  for i = 1, 3 do redis.call('EXPIRE', KEYS[i], retention) end
  local idempotency = redis.call('HGET', KEYS[1], 'idempotency_key')
  if idempotency then redis.call('EXPIRE', idempotency, retention) end
end
