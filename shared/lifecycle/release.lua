-- uses: job_keys, enqueue, tenant_move, end_event, hset_fields, end_job, lease
-- running -> running (requeued for another worker to resume from its stream), or running -> failed
-- once the job has run `max_attempts` times. `worker` '' releases only a lapsed lease (a reaper);
-- a worker's id also releases its own (a worker handing its job back), and only the run `attempt`
-- names: that worker may have resumed the job meanwhile, a later run it must not hand back (0: any
-- run, for a reaper, which releases only a lapsed lease). A requeued job goes back on its
-- model's queue where it was (`enqueue.lua`), and its record and stream live `lifetime` seconds from
-- now, for the wait. Takes `arguments.ReleaseArgs`.
--
-- KEYS: `JobKeys` of the job and of its model (its record's `model`), whose `wakeup` and `share_prefix`
-- the args name: a requeued job goes back into its share too, and counts as its tenant's queued job, not a running one, until a worker resumes it.
--
-- Failing a job needs its output, which the caller computes from the stream: the first call of a
-- job out of attempts answers {'exhausted'} and drops the lease (so that nothing writes to the
-- stream any more; the job stays in the running set, for a reaper should the caller vanish). The
-- caller then reads the stream and calls again with its `failure`: the event, the record's `fields`
-- computed from it (the output the stream holds: text, reasoning, tool calls, usage) and `stream_tip`,
-- the id of its last entry; the job fails only if the stream still ends there.
-- Answers {'held'}, {'requeued'}, {'exhausted'}, {'failed'} or {'not_running', status or 'missing'}.
local args = cjson.decode(ARGV[1])
local job, model = job_keys(args)
local id, failure = args.id, args.failure
local record, stream, lease, running, queue = job.record, job.stream, job.lease, job.running, model.queue

local holder = redis.call('GET', lease)
if holder and not lease_held_by(holder, args.worker) then return {'held'} end
if args.attempt ~= 0 and tonumber(redis.call('HGET', record, 'attempts')) ~= args.attempt then return {'held'} end
local status = redis.call('HGET', record, 'status')
if status ~= 'running' then
  redis.call('SREM', running, id)
  return {'not_running', status or 'missing'}
end
local worker = redis.call('HGET', record, 'worker') or ''
if redis.call('HGET', record, 'requeued') then
  redis.call('SREM', running, id)
  return {'requeued', worker}
end
redis.call('DEL', lease)
if tonumber(redis.call('HGET', record, 'attempts') or '1') < args.max_attempts then
  redis.call('SREM', running, id)
  redis.call('HSET', record, 'requeued', '1')
  redis.call('EXPIRE', record, args.lifetime)
  if stream ~= '' then redis.call('EXPIRE', stream, args.lifetime) end
  local created_at, share, priority = unpack(redis.call('HMGET', record, 'created_at', 'share', 'priority'))
  enqueue({id = id, created_at = created_at, share = share, priority = priority, lifetime = args.lifetime}, model)
  tenant_move(job, 'running', 'queued', args.lifetime)
  return {'requeued', worker}
end
if not failure then return {'exhausted', worker} end
if stream ~= '' then
  local last = redis.call('XREVRANGE', stream, '+', '-', 'COUNT', 1)[1]
  if failure.stream_tip ~= (last and last[1] or '') then return {'exhausted', worker} end
end
end_event(job, 'error', failure.event)
redis.call('SREM', running, id)
redis.call('HSET', record, 'status', 'failed', 'finished_at', args.now, 'error', args.message)
hset_fields(record, failure.fields)
redis.call('ZREM', queue, id)
end_job(job, 'running')
return {'failed'}
