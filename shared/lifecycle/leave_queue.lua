-- uses: share_member
-- Takes a job out of its model's queue and its tenant's share of it, in the scripts that end its wait
-- (start, and a cancel or a deadline that ends it unrun), so that the share holds only waiting jobs
-- and a queued job's position counts only those; a job with a deadline leaves the model's
-- `deadlines` too, which then holds only jobs the deadline sweep may have to end. The share's member
-- is made from the same record fields as `enqueue.lua` made it. `job`: {id, record}; `model`: the
-- model's {queue, share_prefix, deadlines}.
local function leave_queue(job, model)
  redis.call('ZREM', model.queue, job.id)
  local share, created_at, deadline = unpack(redis.call('HMGET', job.record, 'share', 'created_at', 'deadline'))
  redis.call('ZREM', model.share_prefix .. share, share_member(created_at, job.id))
  if deadline then redis.call('ZREM', model.deadlines, job.id) end
end
