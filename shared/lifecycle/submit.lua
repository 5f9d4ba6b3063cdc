-- uses: job_keys, tenant_admit, append_event, hset_fields, share_member, enqueue, clock_ms, prefix_holder
-- queued: write the record (with the canonical name of the job's model, whose queue `queue` is),
-- the `queued` event, and the `fields` the record keeps beside the job (what an API layer above the
-- job needs of it: a response's own fields, a webhook), and put the job on its model's queue
-- (`enqueue.lua`). Takes `arguments.SubmitArgs`.
-- Answers {'created', id, created_at}, {'existing', id} (the idempotency key's job, asked for
-- with the same request), {'mismatch', id} (the key's job was asked for with another request:
-- nothing written), {'overloaded', queue depth} (the model's queue is at `max_queued`: below) or
-- {'rate_limited', limit, retry after (s), count, limit} (the job's tenant is at a limit:
-- `tenant_admit.lua`; nothing written).
-- The idempotency key holds '<job id> <request digest>'; a value without a digest (written
-- before digests were kept) matches any request.
-- A job id given by its caller (a batch's line: `shared.batches.line_job_id`) whose record exists
-- answers {'existing', id}, as a replayed idempotency key does: submitting it again writes nothing.
-- KEYS: `JobKeys` of the job and of its model, then its idempotency key ('' for none), the tenant's
-- counters ('' each for a job of no tenant) and the job index ('' for none: the newest `index_size`
-- jobs by submission); the model's `deadlines` (of `JobKeys`), which a job with a `deadline` (unix seconds) joins, scored by it or by its
-- record's expiry if that comes first, so that it never holds a job whose keys are gone for long;
-- the model's `prefix_blocks` and the workers' heartbeats (`Keys.workers`): a job given its prompt's
-- leading `blocks` keeps the live worker that holds the longest prefix of them as its `prefer`
-- (`prefix_holder.lua`), which `claim.lua` leaves the job to for a while.
local args = cjson.decode(ARGV[1])
local job, model = job_keys(args)
local idempotency, tenant_queued, tenant_running, tenant_requests, tenant_tokens, index, prefix_blocks,
      workers = unpack(KEYS, JOB_KEYS + 1)
local id, tenant, share = args.id, args.tenant, args.share
local record, stream, queue, deadlines = job.record, job.stream, model.queue, model.deadlines
model.share_prefix = share.prefix

if redis.call('EXISTS', record) == 1 then return {'existing', id} end

if idempotency ~= '' then
  local existing = redis.call('GET', idempotency)
  if existing then
    local key_job, kept = string.match(existing, '^(%S+) ?(%S*)$')
    if kept ~= '' and kept ~= args.digest then return {'mismatch', key_job} end
    return {'existing', key_job}
  end
end
if tenant then
  local refused = tenant_admit(tenant_queued, tenant_running, tenant_requests, tenant_tokens, args.job_prefix,
                               tenant.limits)
  if refused then return {'rate_limited', unpack(refused)} end
end
if args.max_queued > 0 then
  -- A batch's job comes in only while the whole queue is under the bound: it takes the room interactive
  -- work leaves. An interactive job is refused only once interactive jobs alone fill the bound, so
  -- waiting batch jobs never turn one away (the queue holds at most twice the bound).
  local depth = redis.call('ZCARD', queue)
  if depth >= args.max_queued and share_band(share.name) == 'interactive' then
    for _, batch_share in ipairs(redis.call('ZRANGE', model.batch_share_tenants, 0, -1)) do
      depth = depth - redis.call('ZCARD', share.prefix .. batch_share)
    end
  end
  if depth >= args.max_queued then return {'overloaded', tostring(depth)} end
end
redis.call('HSET', record, 'id', id, 'status', 'queued', 'created_at', args.created_at, 'request', args.request,
           'owner', args.owner, 'model', args.model, 'share', share.name, 'priority', share.priority)
if idempotency ~= '' then redis.call('HSET', record, 'idempotency_key', idempotency) end
hset_fields(record, args.fields)
if #args.blocks > 0 then
  local holder, held = prefix_holder(prefix_blocks, workers, args.blocks, clock_ms())
  if holder then
    redis.call('HSET', record, 'prefer', holder, 'prefer_blocks', held)
    -- The holder's own list of the share's jobs it holds, longest held first within a priority.
    local preferred = args.preferred.prefix .. holder .. ':' .. share.name
    redis.call('ZADD', preferred, share.priority * args.preferred.scale - held, share_member(args.created_at, id))
    if redis.call('TTL', preferred) < args.lifetime then redis.call('EXPIRE', preferred, args.lifetime) end
  end
end
redis.call('EXPIRE', record, args.lifetime)
if stream ~= '' then
  append_event(stream, args.maxlen, nil, 'status', args.queued_event)
  redis.call('EXPIRE', stream, args.lifetime)
end
redis.call('HSET', model.share_state, 'stride:' .. share.name, share.stride)
enqueue({id = id, created_at = args.created_at, share = share.name, priority = share.priority,
         lifetime = args.lifetime}, model)
if tenant then tenant_admitted(tenant_queued, tenant_requests, id, args.lifetime) end
if idempotency ~= '' then redis.call('SET', idempotency, id .. ' ' .. args.digest, 'EX', args.lifetime) end
if args.deadline then
  redis.call('HSET', record, 'deadline', args.deadline)
  redis.call('ZADD', deadlines, math.min(tonumber(args.deadline), tonumber(args.created_at) + args.lifetime), id)
end
if index ~= '' then
  redis.call('ZADD', index, math.floor(tonumber(args.created_at) * 1000), id)
  redis.call('ZREMRANGEBYRANK', index, 0, -args.index_size - 1)  -- the oldest beyond the bound
  redis.call('EXPIRE', index, args.lifetime, 'NX')  -- it outlives its newest job, and no longer
  redis.call('EXPIRE', index, args.lifetime, 'GT')
end
return {'created', id, args.created_at}
