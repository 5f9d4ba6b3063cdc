-- uses: announce_end, tenant_move, batch_end
-- The end of a job, in every script that ends one (finish, release, cancel, and `end_unrun.lua`),
-- called once its record holds the end: every key the job made expires after the retention period
-- (the idempotency key's name is read from the record: single-instance Redis, not Redis Cluster), its
-- webhook hears of the end (`announce_end.lua`), it leaves its tenant's counters, `from` 'queued'
-- or 'running', with its usage counted (`tenant_move.lua`), its batch counts it (`batch_end.lua`), and
-- the gateways' stream readers hear of its stream's last entries (`Keys.notices`).
-- `job`: {id, record, stream, cancel, webhooks, webhook (its delivery record), retention, notices}.
local function end_job(job, from)
  for _, key in ipairs({job.record, job.stream, job.cancel}) do
    if key ~= '' then redis.call('EXPIRE', key, job.retention) end
  end
  local idempotency = redis.call('HGET', job.record, 'idempotency_key')
  if idempotency then redis.call('EXPIRE', idempotency, job.retention) end
  announce_end(job)
  tenant_move(job, from, 'ended')
  batch_end(job)
  if job.stream ~= '' then redis.call('PUBLISH', job.notices, job.stream) end
end
