-- uses: job_keys, expire_unrun
-- queued, past its deadline -> failed, as a worker's start would end it (`expire_unrun.lua`), for a
-- job no worker starts in time (none is live, or all are busy): the gateways' deadline sweep calls it
-- for each job whose score in its model's `deadlines` has come. A job no longer queued (started,
-- ended, or its keys expired) only leaves `deadlines`; one whose deadline has not come (its score
-- was its record's expiry: `submit.lua`) is scored again by its deadline. Gateways sweeping together
-- end a job once: the second call finds it failed. Takes `arguments.ExpireArgs`.
-- KEYS: `JobKeys` of the job and of its model.
-- Answers 'expired', or the state the job is in ('queued' for one not due, 'missing' for none).
local args = cjson.decode(ARGV[1])
local job, model = job_keys(args)
local record, deadlines = job.record, model.deadlines

local status, deadline = unpack(redis.call('HMGET', record, 'status', 'deadline'))
if status ~= 'queued' or not deadline then
  redis.call('ZREM', deadlines, args.id)
  return status or 'missing'
end
if expire_unrun(job, model, deadline, args.expired_message, args.expired_event) then return 'expired' end
redis.call('ZADD', deadlines, deadline, args.id)
return status
