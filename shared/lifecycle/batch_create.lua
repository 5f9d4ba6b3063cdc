-- uses: hset_fields
-- A new batch (`gateway.batches`): its record, `validating`, among its owner's batches and the active
-- ones, unless its API key or its tenant already runs as many batches as it may (0: no bound). The
-- record names the key's and the tenant's sets of running batches, which the batch leaves when it
-- ends (`batch_move.lua`). Takes `arguments.BatchCreateArgs`.
-- KEYS: the batch's record, its owner's batches, the active batches, the key's running batches and
-- the tenant's ('' for none). Answers {'created'} or {'too_many', 'key' or 'tenant', count, bound}.
local record, owned, active, of_key, of_tenant = unpack(KEYS)
local args = cjson.decode(ARGV[1])
for _, bound in ipairs({{'key', of_key, args.max_of_key}, {'tenant', of_tenant, args.max_of_tenant}}) do
  local scope, set, most = unpack(bound)
  if set ~= '' and most > 0 then
    local running = redis.call('ZCARD', set)
    if running >= most then return {'too_many', scope, running, most} end
  end
end
hset_fields(record, args.fields)
redis.call('HSET', record, 'running_of_key', of_key)
if of_tenant ~= '' then redis.call('HSET', record, 'running_of_tenant', of_tenant) end
for _, set in ipairs({owned, active, of_key, of_tenant}) do
  if set ~= '' then redis.call('ZADD', set, args.score, args.id) end
end
return {'created'}
