-- Counts a batch's job's end in its batch's record (`Keys.batch`, named by the job record's `batch`
-- field: single-instance Redis, not Redis Cluster), as OpenAI's `request_counts`: `completed` for a
-- job that completed, `failed` for any other end. A job ends once, so it is counted once, whichever
-- worker or gateway ends it. A job of no batch, or of a batch whose record is gone, is left alone.
-- While the batch runs (its record has no TTL yet), the job's id joins the batch's ended jobs
-- (`Keys.batch_ended`, named by the record's `batch_ended`), whose keys its driver keeps until the
-- batch's output is written, however long after the retention that is.
-- `job`: {id, record}.
local function batch_end(job)
  local batch, status, ended = unpack(redis.call('HMGET', job.record, 'batch', 'status', 'batch_ended'))
  if not batch or redis.call('EXISTS', batch) == 0 then return end
  redis.call('HINCRBY', batch, status == 'completed' and 'completed' or 'failed', 1)
  if ended and redis.call('TTL', batch) == -1 then redis.call('RPUSH', ended, job.id) end
end
