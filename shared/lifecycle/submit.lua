-- uses: tenant_admit, share_enqueue, append_event
-- queued: write the record (with the canonical name of the job's model, whose queue `queue` is),
-- the `queued` event and arq's job, and put the job on its model's queue and in its share of it
-- (`share_enqueue.lua`).
-- Answers {'created', id, created_at}, {'existing', id} (the idempotency key's job, asked for
-- with the same request), {'mismatch', id} (the key's job was asked for with another request:
-- nothing written), {'overloaded', queue depth} or {'rate_limited', limit, retry after (s), count,
-- limit} (the job's tenant is at a limit: `tenant_admit.lua`; nothing written).
-- The idempotency key holds '<job id> <request digest>'; a value without a digest (written
-- before digests were kept) matches any request.
-- ARGV after the model: name/value pairs the record keeps beside the job (what an API layer
-- above the job needs of it: a response's own fields, a webhook), written in the same step.
-- The tenant (ARGV 14 to 18: its name, '' for none, and its limits; KEYS 6 to 9: its counters), the
-- job's share of the queue (ARGV 19 to 22: the share's name, the prefix of the share queues, the
-- share's stride and the job's priority; KEYS 10 and 11: the model's `share_tenants` and
-- `share_state`) and the prefix of job records' keys (ARGV 23: the tenant's running jobs are counted
-- from their records) come before them: they begin at FIRST_FIELD.
local record, stream, idempotency, queue, arq_job = unpack(KEYS)
local id, created_at, request, queued_event, arq_payload, lifetime, max_queued, maxlen, score, owner,
      wakeup_channel, digest, model = unpack(ARGV, 1, 13)
local tenant_queued, tenant_running, tenant_requests, tenant_tokens, share_tenants, share_state =
  unpack(KEYS, 6, 11)
local tenant = ARGV[14]
local share, share_prefix, stride, priority, job_prefix = unpack(ARGV, 19, 23)
local FIRST_FIELD = 24

if idempotency ~= '' then
  local existing = redis.call('GET', idempotency)
  if existing then
    local job, kept = string.match(existing, '^(%S+) ?(%S*)$')
    if kept ~= '' and kept ~= digest then return {'mismatch', job} end
    return {'existing', job}
  end
end
if tenant ~= '' then
  local limits = {queued = tonumber(ARGV[15]), running = tonumber(ARGV[16]), requests = tonumber(ARGV[17]),
                  tokens = tonumber(ARGV[18])}
  local refused = tenant_admit(tenant_queued, tenant_running, tenant_requests, tenant_tokens, job_prefix,
                               limits)
  if refused then return {'rate_limited', unpack(refused)} end
end
local limit = tonumber(max_queued)
if limit > 0 then
  local depth = redis.call('ZCARD', queue)
  if depth >= limit then return {'overloaded', tostring(depth)} end
end
redis.call('HSET', record, 'id', id, 'status', 'queued', 'created_at', created_at, 'request', request,
           'owner', owner, 'model', model, 'share', share, 'priority', priority)
if idempotency ~= '' then redis.call('HSET', record, 'idempotency_key', idempotency) end
if #ARGV >= FIRST_FIELD then redis.call('HSET', record, unpack(ARGV, FIRST_FIELD)) end
append_event(stream, maxlen, nil, 'status', queued_event)
redis.call('EXPIRE', record, lifetime)
redis.call('EXPIRE', stream, lifetime)
redis.call('SET', arq_job, arq_payload, 'EX', lifetime)
redis.call('ZADD', queue, score, id)
redis.call('HSET', share_state, 'stride:' .. share, stride)
share_enqueue(share_tenants, share_state, share_prefix .. share, share, priority, tonumber(score), id, lifetime)
if tenant ~= '' then tenant_admitted(tenant_queued, tenant_requests, id, lifetime) end
redis.call('PUBLISH', wakeup_channel, id)
if idempotency ~= '' then redis.call('SET', idempotency, id .. ' ' .. digest, 'EX', lifetime) end
return {'created', id, created_at}
