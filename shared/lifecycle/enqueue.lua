-- uses: share_member
-- Puts a job on its model's queue, in the scripts that queue it (submit, and release's requeue): the
-- model's queue (arq's queue set: a job id scored by submission ms), so that a
-- requeued job keeps its place (a rolling restart does not send resumed jobs behind the backlog); its
-- tenant's share of the queue (`ModelKeys.share_queue_prefix`), in order of priority then of
-- submission; and a wake-up for the model's idle workers. A tenant that had no job waiting becomes
-- active again at the model's clock, or at its own last pass if that is later: pausing saves no
-- turns, and emptying the queue to submit anew skips none (start-time fair queuing: `claim.lua`).
-- A batch's job (its share named `batch:<tenant>`: `share_band`) joins the batch band's shares, which
-- keep a clock of their own (`batch_clock`) and are served only when no interactive share has a job.
-- `job`: {id, created_at, share, priority, lifetime};
-- `model`: the model's {queue, share_tenants, batch_share_tenants, share_state, share_prefix, wakeup}.
local function enqueue(job, model)
  redis.call('ZADD', model.queue, queued_ms(job.created_at), job.id)
  local share_queue = model.share_prefix .. job.share
  redis.call('ZADD', share_queue, job.priority, share_member(job.created_at, job.id))
  if redis.call('TTL', share_queue) < tonumber(job.lifetime) then redis.call('EXPIRE', share_queue, job.lifetime) end
  local tenants, clock_field = model.share_tenants, 'clock'
  if share_band(job.share) == 'batch' then tenants, clock_field = model.batch_share_tenants, 'batch_clock' end
  if not redis.call('ZSCORE', tenants, job.share) then
    local clock = tonumber(redis.call('HGET', model.share_state, clock_field)) or 0
    local pass = tonumber(redis.call('HGET', model.share_state, 'pass:' .. job.share)) or 0
    redis.call('ZADD', tenants, math.max(clock, pass), job.share)
  end
  redis.call('PUBLISH', model.wakeup, job.id)
end
