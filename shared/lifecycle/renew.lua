-- running -> running: extend the leases this worker holds, and with each its job's record and
-- stream, so that a job's keys outlive its run however long it waited in the queue or how often it
-- was resumed. KEYS: per job its lease, record and stream. Answers the positions (from 1) of the
-- jobs whose lease the worker no longer holds: it never brings back a lapsed lease or takes another's.
-- Takes `arguments.RenewArgs`.
local args = cjson.decode(ARGV[1])
local worker, lease_ms, lifetime = args.worker, args.lease_ms, args.lifetime
local KEYS_PER_JOB = 3

local lost = {}
for i = 1, #KEYS, KEYS_PER_JOB do
  if redis.call('GET', KEYS[i]) == worker then
    redis.call('PEXPIRE', KEYS[i], lease_ms)
    redis.call('EXPIRE', KEYS[i + 1], lifetime)
    redis.call('EXPIRE', KEYS[i + 2], lifetime)
  else
    lost[#lost + 1] = (i - 1) / KEYS_PER_JOB + 1
  end
end
return lost
