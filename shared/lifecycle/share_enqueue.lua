-- Prepended to the scripts that put a job on its model's queue (submit, release). The job joins its
-- tenant's share of the queue (`ModelKeys.share_queue_prefix`), in order of priority and then of
-- submission. A tenant that had no job waiting becomes active again at the model's clock, or at
-- its own last pass if that is later: pausing saves no turns, and emptying the queue to submit anew
-- skips none (start-time fair queuing: `claim.lua`).
local function share_enqueue(tenants, state, share_queue, tenant, priority, created_ms, id, lifetime)
  redis.call('ZADD', share_queue, priority, string.format('%015d:%s', created_ms, id))
  if redis.call('TTL', share_queue) < tonumber(lifetime) then redis.call('EXPIRE', share_queue, lifetime) end
  if not redis.call('ZSCORE', tenants, tenant) then
    local clock = tonumber(redis.call('HGET', state, 'clock')) or 0
    local pass = tonumber(redis.call('HGET', state, 'pass:' .. tenant)) or 0
    redis.call('ZADD', tenants, math.max(clock, pass), tenant)
  end
end
