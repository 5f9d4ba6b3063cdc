-- uses: clock_ms
-- Called by submit. A tenant's limits (named as `shared.tenants.LIMITS` names them; 0 is none)
-- against its counters (`Keys.tenant_*`), as Redis's clock reads now. `max_running_jobs` bounds the
-- tenant's queued and running jobs together: a job admitted now may start at any moment, so only that
-- bound keeps the tenant's running jobs under it whatever the workers take. The minute windows slide:
-- an entry leaves a minute after it was counted. `tenant_admit` answers nil when the job may come in,
-- or {limit, seconds until retrying may succeed, the count now, the limit}; `tenant_admitted` counts
-- the job, once written, as queued (until its record would expire) and as a request of this minute.
local TENANT_WINDOW_MS = 60000
local TENANT_COUNT_RETRY_SECONDS = 1  -- a count limit frees when some job ends: no time is known

local function tenant_retry(counted_ms, now)
  return math.max(1, math.ceil((counted_ms + TENANT_WINDOW_MS - now) / 1000))
end

-- The tenant's running jobs (`running`, the set `tenant_move.lua` keeps), counted from their records
-- (`job_prefix` followed by an id names one): an id whose record is gone or no longer running (its
-- job's keys expired while no worker held it, or it ended without leaving the set) is dropped, so
-- that no such id holds one of the tenant's slots for good.
local function tenant_running_jobs(running, job_prefix)
  for _, id in ipairs(redis.call('SMEMBERS', running)) do
    if redis.call('HGET', job_prefix .. id, 'status') ~= 'running' then redis.call('SREM', running, id) end
  end
  return redis.call('SCARD', running)
end

local function tenant_admit(queued, running, requests, tokens, job_prefix, limits)
  local max_queued, max_running = limits.max_queued_jobs, limits.max_running_jobs
  local max_requests, max_tokens = limits.requests_per_minute, limits.tokens_per_minute
  local now = clock_ms()
  local since = now - TENANT_WINDOW_MS
  redis.call('ZREMRANGEBYSCORE', queued, '-inf', now)  -- unstarted jobs whose records expired
  local waiting = redis.call('ZCARD', queued)
  if max_queued > 0 and waiting >= max_queued then
    return {'max_queued_jobs', TENANT_COUNT_RETRY_SECONDS, waiting, max_queued}
  end
  if max_running > 0 then
    local in_flight = waiting + tenant_running_jobs(running, job_prefix)
    if in_flight >= max_running then
      return {'max_running_jobs', TENANT_COUNT_RETRY_SECONDS, in_flight, max_running}
    end
  end
  if max_requests > 0 then
    redis.call('ZREMRANGEBYSCORE', requests, '-inf', since)
    local count = redis.call('ZCARD', requests)
    if count >= max_requests then
      -- under the limit once the oldest `count - limit + 1` requests have left the window
      local last = redis.call('ZRANGE', requests, count - max_requests, count - max_requests, 'WITHSCORES')
      return {'requests_per_minute', tenant_retry(tonumber(last[2]), now), count, max_requests}
    end
  end
  if max_tokens > 0 then
    redis.call('ZREMRANGEBYSCORE', tokens, '-inf', since)
    local entries = redis.call('ZRANGE', tokens, 0, -1, 'WITHSCORES')
    local used = 0
    for i = 1, #entries, 2 do used = used + tonumber(string.match(entries[i], ':(%d+)$')) end
    local left = used
    for i = 1, #entries, 2 do
      if left < max_tokens then break end
      left = left - tonumber(string.match(entries[i], ':(%d+)$'))
      if left < max_tokens then
        return {'tokens_per_minute', tenant_retry(tonumber(entries[i + 1]), now), used, max_tokens}
      end
    end
  end
  return nil
end

local function tenant_admitted(queued, requests, id, lifetime)
  local now = clock_ms()
  redis.call('ZADD', queued, now + 1000 * tonumber(lifetime), id)
  redis.call('ZADD', requests, now, id)
  redis.call('PEXPIRE', requests, TENANT_WINDOW_MS)
end
