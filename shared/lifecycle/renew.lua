-- uses: read_keys, lease
-- running -> running: extend the leases this worker holds, and with some of them their job's record
-- and stream, so that a job's keys outlive its run however long it waited in the queue or how often
-- it was resumed. A lease lasts seconds and is extended at every heartbeat; a job's keys last a job
-- lifetime, and extending them as often would cost Redis twice the lease's own: the worker asks for
-- them only now and then (`extend`: `worker.leases`). Answers the positions (from 1) of the jobs
-- whose lease the worker no longer holds: it never brings back a lapsed lease or takes another's,
-- nor extends the keys of a job whose lease it does not hold.
-- KEYS: every job's lease; then, for each job `extend` names, its record and stream. Takes
-- `arguments.RenewArgs`.
local args = cjson.decode(ARGV[1])
local worker, lease_ms, lifetime, extend = args.worker, args.lease_ms, args.lifetime, args.extend
local jobs = #KEYS - 2 * #extend
local held = get_keys(1, jobs)

local lost = {}
for job = 1, jobs do
  if lease_held_by(held[job], worker) then
    redis.call('PEXPIRE', KEYS[job], lease_ms)
  else
    lost[#lost + 1] = job
  end
end
for i, job in ipairs(extend) do
  if lease_held_by(held[job], worker) then
    redis.call('EXPIRE', KEYS[jobs + 2 * i - 1], lifetime)
    if KEYS[jobs + 2 * i] ~= '' then redis.call('EXPIRE', KEYS[jobs + 2 * i], lifetime) end
  end
end
return lost
