-- queued -> cancelled at once; for a running job, set its cancel key (holding when the first
-- cancel was asked for, for the cancel latency): its worker's next step ends it cancelled.
-- `queue` is the queue of the job's model (its record's `model`), `share_prefix` that model's.
-- Answers {'cancelled' | 'asked' | 'ended', the state the job is in now} or {'missing'}.
local record, _, cancel, queue, arq_job, webhooks, webhook = unpack(KEYS)
local id, now, cancelled_event, maxlen, retention, lifetime, share_prefix = unpack(ARGV)

local status = redis.call('HGET', record, 'status')
if not status then return {'missing'} end
if status == 'queued' then
  end_unrun(id, now, 'cancelled', nil, 'cancelled', cancelled_event, queue, share_prefix, arq_job,
            webhooks, webhook, maxlen, retention)
  return {'cancelled', 'cancelled'}
end
if status == 'running' then
  redis.call('SET', cancel, now, 'EX', lifetime, 'NX')
  return {'asked', status}
end
return {'ended', status}
