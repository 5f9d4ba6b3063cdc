-- uses: clock_ms
-- Called by the scripts that move a job past queued. A job of a tenant has its record name its
-- tenant's counters (`Keys.tenant_record_fields`, written at submit): the job leaves its tenant's
-- queued jobs when it starts or ends unstarted (`from` 'queued'), joins its running jobs when it
-- starts (`to` 'running') and leaves them when it ends or is handed back (`from` 'running'). A job
-- handed back waits in its model's queue again, and counts as queued (`to` 'queued') until its
-- record would expire, `lifetime` seconds from now, as a submitted job does. An end (`to` 'ended')
-- counts the record's usage, prompt plus generated tokens, in the tenant's sliding minute and, with
-- the job, in its totals: call it once the record holds the end. A job without a tenant is left alone.
-- `job`: {id, record}.
local function tenant_move(job, from, to, lifetime)
  local id = job.id
  local tenant, queued, running, tokens, totals, usage = unpack(redis.call('HMGET', job.record,
      'tenant', 'tenant_queued', 'tenant_running', 'tenant_tokens', 'tenant_totals', 'usage'))
  if not tenant then return end
  if from == 'queued' then redis.call('ZREM', queued, id) end
  if from == 'running' then redis.call('SREM', running, id) end
  if to == 'running' then redis.call('SADD', running, id) end
  if to == 'queued' then redis.call('ZADD', queued, clock_ms() + 1000 * tonumber(lifetime), id) end
  if to ~= 'ended' then return end
  local spent = 0
  if usage then
    local counts = cjson.decode(usage)
    spent = (tonumber(counts['prompt_tokens']) or 0) + (tonumber(counts['completion_tokens']) or 0)
  end
  redis.call('HINCRBY', totals, tenant .. ':jobs', 1)
  redis.call('HINCRBY', totals, tenant .. ':tokens', spent)
  if spent > 0 then
    redis.call('ZADD', tokens, clock_ms(), id .. ':' .. spent)
    redis.call('PEXPIRE', tokens, 60000)  -- tenant_admit.lua's TENANT_WINDOW_MS
  end
end
