-- Prepended to the scripts that end a job, called once the job's record holds its end. A job whose
-- record keeps a webhook (the `annotation:webhook_url` field: `JobStore`'s ANNOTATION prefix and
-- `shared.webhooks.WEBHOOK_URL`) gets its end announced in the same step: an entry on the webhooks
-- stream, which the gateways' senders deliver, and the delivery record its owner reads. Both hold
-- all a sender needs, so a delivery depends neither on a worker nor on the job's keys still living.
-- Expects KEYS[1] to be the job's record.
local function announce_end(webhooks, delivery, retention)
  local url = redis.call('HGET', KEYS[1], 'annotation:webhook_url')
  if not url then return end
  local job, api, owner, state, finish_reason, ended_at = unpack(redis.call('HMGET', KEYS[1],
      'id', 'annotation:api', 'owner', 'status', 'finish_reason', 'finished_at'))
  local fields = {'job', job, 'url', url, 'api', api or 'job', 'owner', owner, 'state', state,
                  'finish_reason', finish_reason or '', 'ended_at', ended_at}
  redis.call('XADD', webhooks, '*', unpack(fields))
  redis.call('HSET', delivery, 'status', 'pending', 'attempts', 0, unpack(fields))
  redis.call('EXPIRE', delivery, retention)
end
