-- uses: hset_fields, announce_end
-- A batch's record moves on (`gateway.batches`): to `to`, with `fields`, only from one of the states
-- `allowed` names, so that a cancel and its gateway's own progress never overwrite each other. A batch
-- that ends (`ends`) leaves the active batches (and its key's and tenant's, which its record names:
-- `batch_create.lua`), its record and its refusals expire after the retention, its list of ended jobs
-- goes (their keys are the driver's to let go), and its webhook hears of the end in the same step:
-- the record keeps the fields a job's does (`id`, `owner`, `status`, `finished_at`, and the webhook's
-- as annotations), so `announce_end.lua` announces it as it does a job. Takes `arguments.BatchMoveArgs`.
-- KEYS: the batch's record, its refusals, the active batches, the webhooks stream, the batch's
-- delivery record and its ended jobs. Answers {'moved'} or {'stayed', status or 'missing'}.
local record, refusals, active, webhooks, webhook, ended = unpack(KEYS)
local args = cjson.decode(ARGV[1])
local status = redis.call('HGET', record, 'status')
local allowed = false
for _, state in ipairs(args.allowed) do
  if state == status then allowed = true end
end
if not allowed then return {'stayed', status or 'missing'} end
redis.call('HSET', record, 'status', args.to)
hset_fields(record, args.fields)
if args.ends then
  redis.call('ZREM', active, args.id)
  for _, set in ipairs(redis.call('HMGET', record, 'running_of_key', 'running_of_tenant')) do
    if set then redis.call('ZREM', set, args.id) end
  end
  redis.call('DEL', ended)
  for _, key in ipairs({record, refusals}) do redis.call('EXPIRE', key, args.retention) end
  announce_end({record = record, webhooks = webhooks, webhook = webhook, retention = args.retention})
end
return {'moved'}
