-- Counts a batch's job's end in its batch's record (`Keys.batch`, named by the job record's `batch`
-- field: single-instance Redis, not Redis Cluster), as OpenAI's `request_counts`: `completed` for a
-- job that completed, `failed` for any other end. A job ends once, so it is counted once, whichever
-- worker or gateway ends it. A job of no batch, or of a batch whose record is gone, is left alone.
-- `job`: {record}.
local function batch_end(job)
  local batch, status = unpack(redis.call('HMGET', job.record, 'batch', 'status'))
  if not batch or redis.call('EXISTS', batch) == 0 then return end
  redis.call('HINCRBY', batch, status == 'completed' and 'completed' or 'failed', 1)
end
