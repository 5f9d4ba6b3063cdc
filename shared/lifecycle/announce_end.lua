-- Announces a job's end (`end_job.lua`), once its record holds it. A job whose record keeps a webhook
-- (the `annotation:webhook_url` field: `JobStore`'s ANNOTATION prefix and
-- `shared.webhooks.WEBHOOK_URL`) gets its end announced in the same step: an entry on the webhooks
-- stream, which the gateways' senders deliver, and the delivery record its owner reads. Both hold
-- all a sender needs, so a delivery depends neither on a worker nor on the job's keys still living.
-- `job`: {record, webhooks (the stream), webhook (the delivery record), retention}.
local function announce_end(job)
  local url = redis.call('HGET', job.record, 'annotation:webhook_url')
  if not url then return end
  local id, api, owner, state, finish_reason, ended_at = unpack(redis.call('HMGET', job.record,
      'id', 'annotation:api', 'owner', 'status', 'finish_reason', 'finished_at'))
  local fields = {'job', id, 'url', url, 'api', api or 'job', 'owner', owner, 'state', state,
                  'finish_reason', finish_reason or '', 'ended_at', ended_at}
  redis.call('XADD', job.webhooks, '*', unpack(fields))
  redis.call('HSET', job.webhook, 'status', 'pending', 'attempts', 0, unpack(fields))
  redis.call('EXPIRE', job.webhook, job.retention)
end
