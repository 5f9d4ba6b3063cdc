-- uses: append_event, share_leave, expire_job, announce_end, tenant_move
-- Prepended to the scripts that end a queued job that never ran: a cancel (cancel.lua), and a
-- deadline that passed while it waited (start.lua). Its record ends in `state` with no output (and
-- `error`, when there is one), `event` of type `kind` ends its stream, and the job leaves its
-- model's queue, its share of it, arq's queue and its tenant's queued jobs; its keys expire after
-- the retention period, and its webhook hears of the end. `queue` and `share_prefix` are those of
-- the job's model. Expects KEYS[1..3] to be the job's record, stream and cancel key.
local function end_unrun(id, now, state, error, kind, event, queue, share_prefix, arq_job, webhooks,
                         webhook, maxlen, retention)
  redis.call('HSET', KEYS[1], 'status', state, 'finished_at', now, 'token_count', 0,
             'usage', '{"prompt_tokens":0,"completion_tokens":0}')
  if error then redis.call('HSET', KEYS[1], 'error', error) end
  append_event(KEYS[2], maxlen, nil, kind, event)
  redis.call('ZREM', queue, id)
  share_leave(share_prefix, id)
  redis.call('DEL', arq_job)
  expire_job(retention)
  announce_end(webhooks, webhook, retention)
  tenant_move(id, 'queued', 'ended')
end
