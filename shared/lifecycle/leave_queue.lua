-- uses: share_member
-- Takes a job out of its model's queue and its tenant's share of it, in the scripts that end its wait
-- (start, and a cancel or a deadline that ends it unrun), so that the share holds only waiting jobs
-- and a queued job's position counts only those. The share's member is made from the same record
-- fields as `enqueue.lua` made it. `job`: {id, record}; `model`: the model's {queue, share_prefix}.
local function leave_queue(job, model)
  redis.call('ZREM', model.queue, job.id)
  local share, created_at = unpack(redis.call('HMGET', job.record, 'share', 'created_at'))
  redis.call('ZREM', model.share_prefix .. share, share_member(created_at, job.id))
end
