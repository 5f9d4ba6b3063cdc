-- uses: job_keys, append_event, end_event, hset_fields, end_job, lease
-- running -> completed | cancelled | failed: append the last `events` (the terminal one last) and
-- end the record, if this worker still holds the lease. A job that is no longer running is left as
-- it is, and so is one whose lease this worker no longer holds: nothing is appended. So is one whose
-- stream lacks events before these (a failover's new master had not received the job's last steps:
-- `step.lua`). Events the stream holds already (this end sent again) are not appended twice.
-- KEYS: `JobKeys` of the job. Takes `arguments.FinishArgs`.
-- Answers {'ended', state}, {'not_running', status or 'missing'}, {'lost'} or {'behind', last seq}.
local args = cjson.decode(ARGV[1])
local job = job_keys(args)
local record, stream, lease, events = job.record, job.stream, job.lease, args.events

local status = redis.call('HGET', record, 'status')
if status ~= 'running' then return {'not_running', status or 'missing'} end
if not lease_held_by(redis.call('GET', lease), args.worker) then return {'lost'} end
if stream ~= '' then
  local last = last_seq(stream)
  if #events > 0 and is_behind(last, events[1][2]) then return {'behind', last} end
  for _, event in ipairs(events) do last = append_event(stream, args.maxlen, last, event[1], event[2]) end
elseif #events > 0 then  -- the stream, apart, has them: the record keeps the terminal one
  end_event(job, events[#events][1], events[#events][2])
end
redis.call('HSET', record, 'status', args.state)
hset_fields(record, args.fields)
redis.call('DEL', lease)
redis.call('SREM', job.running, args.id)
end_job(job, 'running')
return {'ended', args.state}
