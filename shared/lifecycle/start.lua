-- uses: job_keys, leave_queue, expire_unrun, append_event, tenant_move, lease
-- queued -> running (attempt 1), or a handed-back running job resumes with the next attempt, its
-- stream in the answer so that the new worker continues where the last one stopped. The starting
-- worker takes the job's lease (its claim's, `claim:<worker>`, becomes the run's, `<worker>`,
-- carrying a cancel asked of a handed-back job meanwhile: `lease.lua`) and the job leaves its
-- model's queue, so that the queue holds only waiting jobs, and the job's record and stream live
-- `lifetime` seconds from now, however long it waited. A start refused drops this worker's claim
-- and the job's stale queue entry (its keys expired, or it ended meanwhile), but not a job another
-- worker has claimed since (this claim lapsed first: `held`). A queued job past its deadline (its
-- record's `deadline`) fails instead (queued -> failed), without ever running (`expire_unrun.lua`).
-- KEYS: `JobKeys` of the job and of the model the starting worker serves and claimed it from. Takes
-- `arguments.StartArgs`.
-- Answers {'running', request, created_at, conversation}, {'resumed', request, created_at, attempt,
-- entries, conversation}, {'expired'} or {'refused', status or 'missing' or 'held'}; `conversation`
-- is the record's field of that name ('' for a job that is no turn of a conversation).
local args = cjson.decode(ARGV[1])
local job, model = job_keys(args)
local id, record, stream, cancel, lease, running = args.id, job.record, job.stream, job.cancel, job.lease, job.running
local queue = model.queue

local asked = redis.call('GET', cancel)

local function take(attempt)
  redis.call('HSET', record, 'worker', args.worker, 'attempts', attempt)
  leave_queue(job, model)
  redis.call('SET', lease, lease_of(args.worker, asked), 'PX', args.lease_ms)
  redis.call('SADD', running, id)
  redis.call('EXPIRE', record, args.lifetime)
  if stream ~= '' then redis.call('EXPIRE', stream, args.lifetime) end
end

local holder = redis.call('GET', lease)
if holder and not lease_held_by(holder, 'claim:' .. args.worker) then return {'refused', 'held'} end

local status, request, created, conversation, deadline =
  unpack(redis.call('HMGET', record, 'status', 'request', 'created_at', 'conversation', 'deadline'))
conversation = conversation or ''
if status == 'running' and redis.call('HGET', record, 'requeued') then
  redis.call('HDEL', record, 'requeued')
  local attempt = tonumber(redis.call('HGET', record, 'attempts')) + 1
  take(attempt)
  tenant_move(job, 'queued', 'running')
  local entries = stream ~= '' and redis.call('XRANGE', stream, '-', '+') or {}
  return {'resumed', request, created, attempt, entries, conversation, asked or ''}
end
if status ~= 'queued' then
  if holder then redis.call('DEL', lease) end
  redis.call('ZREM', queue, id)
  return {'refused', status or 'missing'}
end
if expire_unrun(job, model, deadline, args.expired_message, args.expired_event) then
  if holder then redis.call('DEL', lease) end
  return {'expired'}
end
redis.call('HSET', record, 'status', 'running', 'started_at', args.now)
if stream ~= '' then
  append_event(stream, args.maxlen, nil, 'status', args.running_event)
  redis.call('PUBLISH', args.notices, stream)
end
take(1)
tenant_move(job, 'queued', 'running')
return {'running', request, created, conversation, asked or ''}
