-- uses: job_keys, end_unrun, end_event, hset_fields, leave_queue, end_job, lease
-- queued -> cancelled at once; for a running job, set its cancel key (holding when the first
-- cancel was asked for, for the cancel latency), and have its lease carry the ask (`lease.lua`,
-- its holder and TTL kept): its worker's next step, which reads the lease, ends it cancelled. A
-- worker that resumes the job later finds the cancel key (`start.lua`). A running
-- job no worker holds (handed back to wait for another, or its lease lapsed) has no next step to
-- wait for: running -> cancelled at once too, as a queued job, with the output its stream holds.
-- That output is the caller's to compute from the stream: a first call answers {'unheld'} (its
-- cancel key set all the same, should a worker take the job meanwhile); the caller reads the stream
-- and calls again with `stream_tip`, the id of its last entry ('0-0' for none), and the record's
-- `fields` computed from it, `cancelled_event` numbered after that entry. The job ends only if the
-- stream still ends there and still no worker holds it. Takes `arguments.CancelArgs`.
-- KEYS: `JobKeys` of the job and of its model (its record's `model`); `running` is the set of started
-- jobs the reapers read.
-- Answers {'cancelled' | 'asked' | 'unheld' | 'ended', the state the job is in now} or {'missing'}.
local args = cjson.decode(ARGV[1])
local job, model = job_keys(args)
local id, record, stream, cancel, lease, running = args.id, job.record, job.stream, job.cancel, job.lease, job.running

local status = redis.call('HGET', record, 'status')
if not status then return {'missing'} end
if status == 'queued' then
  end_unrun(job, model, 'cancelled', nil, 'cancelled', args.cancelled_event)
  return {'cancelled', 'cancelled'}
end
if status ~= 'running' then return {'ended', status} end
local asked_at = redis.call('SET', cancel, args.now, 'EX', args.lifetime, 'NX', 'GET') or args.now
local requeued = redis.call('HGET', record, 'requeued')
local holder, asked = lease_holder(redis.call('GET', lease))
if not requeued and holder then
  if not asked then redis.call('SET', lease, lease_of(holder, asked_at), 'KEEPTTL') end
  return {'asked', status}
end
local worker = redis.call('HGET', record, 'worker') or ''
if stream == '' then
  if args.stream_tip == '' then return {'unheld', status, worker} end
else
  local last = redis.call('XREVRANGE', stream, '+', '-', 'COUNT', 1)[1]
  if args.stream_tip ~= (last and last[1] or '0-0') then return {'unheld', status, worker} end
end
end_event(job, 'cancelled', args.cancelled_event)
redis.call('HSET', record, 'status', 'cancelled')
hset_fields(record, args.fields)
redis.call('HDEL', record, 'requeued')
leave_queue(job, model)
redis.call('SREM', running, id)
end_job(job, requeued and 'queued' or 'running')
return {'cancelled', 'cancelled'}
