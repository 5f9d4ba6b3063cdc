-- Prepended to the scripts that move a job past queued. A job of a tenant has its record name its
-- tenant's counters (`Keys.tenant_record_fields`, written at submit): the job leaves its tenant's
-- queued jobs when it starts or ends unstarted (`from` 'queued'), joins its running jobs when it
-- starts (`to` 'running') and leaves them when it ends (`from` 'running'). An end (`to` 'ended')
-- counts the record's usage, prompt plus generated tokens, in the tenant's sliding minute and, with
-- the job, in its totals: call it once the record holds the end. A job without a tenant is left alone.
-- Expects KEYS[1] to be the job's record.
local function tenant_move(id, from, to)
  local tenant, queued, running, tokens, totals, usage = unpack(redis.call('HMGET', KEYS[1],
      'tenant', 'tenant_queued', 'tenant_running', 'tenant_tokens', 'tenant_totals', 'usage'))
  if not tenant then return end
  if from == 'queued' then redis.call('ZREM', queued, id) end
  if from == 'running' then redis.call('SREM', running, id) end
  if to == 'running' then redis.call('SADD', running, id) end
  if to ~= 'ended' then return end
  local spent = 0
  if usage then
    local counts = cjson.decode(usage)
    spent = (tonumber(counts['prompt_tokens']) or 0) + (tonumber(counts['completion_tokens']) or 0)
  end
  redis.call('HINCRBY', totals, tenant .. ':jobs', 1)
  redis.call('HINCRBY', totals, tenant .. ':tokens', spent)
  if spent > 0 then
    local now = redis.call('TIME')
    redis.call('ZADD', tokens, tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000), id .. ':' .. spent)
    redis.call('PEXPIRE', tokens, 60000)  -- tenant_admit.lua's TENANT_WINDOW_MS
  end
end
