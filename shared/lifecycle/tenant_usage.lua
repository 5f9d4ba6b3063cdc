-- uses: clock_ms, tenant_admit
-- A tenant's counters now, as `tenant_admit.lua` counts them (its windows read from now, not
-- pruned): its queued jobs whose records have not expired, its running jobs (an id whose job no
-- longer runs dropped: `tenant_running_jobs`), the requests it had admitted and the tokens of its
-- jobs ended in the last minute, and the tokens and jobs of its totals. Takes `arguments.TenantUsageArgs`.
local queued, running, requests, tokens, totals = unpack(KEYS)
local args = cjson.decode(ARGV[1])
local tenant, job_prefix = args.tenant, args.job_prefix
local now = clock_ms()
local since = string.format('(%d', now - TENANT_WINDOW_MS)

local spent = 0
for _, entry in ipairs(redis.call('ZRANGEBYSCORE', tokens, since, '+inf')) do
  spent = spent + tonumber(string.match(entry, ':(%d+)$'))
end
local tokens_total, jobs_total = unpack(redis.call('HMGET', totals, tenant .. ':tokens', tenant .. ':jobs'))
return {redis.call('ZCOUNT', queued, string.format('%d', now), '+inf'),
        tenant_running_jobs(running, job_prefix), redis.call('ZCOUNT', requests, since, '+inf'), spent,
        tonumber(tokens_total) or 0, tonumber(jobs_total) or 0}
