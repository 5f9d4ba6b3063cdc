-- uses: lease
-- queued -> queued: a worker lets go of a job it claimed (`claim.lua`) and will not start (its engine
-- died, or an earlier run of the same job has not ended on it yet), so that another worker picks the
-- job up now rather than once the claim lapses. Only this worker's claim goes; a run's lease stays.
-- KEYS: the job's lease. Takes `arguments.UnclaimArgs`.
local args = cjson.decode(ARGV[1])
if lease_held_by(redis.call('GET', KEYS[1]), 'claim:' .. args.worker) then
  redis.call('DEL', KEYS[1])
  redis.call('PUBLISH', args.wakeup, '')
end
return 0
