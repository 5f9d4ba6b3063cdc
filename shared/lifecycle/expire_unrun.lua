-- uses: end_unrun
-- A queued job whose deadline has come by `job.now` fails without ever running, in the scripts that
-- find it queued (start: a worker that claimed it; expire: the gateways' deadline sweep, for a job no
-- worker starts in time): its record ends `failed` with `message`, `event` (an `error` event, code
-- `deadline_exceeded`) ends its stream, it leaves its queue (`end_unrun.lua`), and its model's count
-- of expired jobs (`model.expired`, a hash by model name: `Keys.jobs_expired`) goes up by one.
-- `deadline`: the record's `deadline` field (unix seconds), nil for a job without one.
-- Answers whether it ended the job.
local function expire_unrun(job, model, deadline, message, event)
  if not deadline or tonumber(deadline) > tonumber(job.now) then return false end
  redis.call('HINCRBY', model.expired, redis.call('HGET', job.record, 'model'), 1)
  end_unrun(job, model, 'failed', message, 'error', event)
  return true
end
