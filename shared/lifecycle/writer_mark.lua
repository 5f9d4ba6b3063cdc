-- uses: lease
-- Data plane, after a cancel of a running job: its writer carries the ask, as its lease does
-- (`lease.lua`), so that the worker's next step, which reads the writer, ends it cancelled. Only
-- `holder`'s writer, and its TTL kept. Takes `arguments.WriterMarkArgs`. KEYS: the job's writer.
-- Answers 1 when the writer carries the ask (now or already), 0 when `holder` holds none.
local writer = KEYS[1]
local args = cjson.decode(ARGV[1])
local holder, asked = lease_holder(redis.call('GET', writer))
if holder ~= args.holder then return 0 end
if not asked then redis.call('SET', writer, lease_of(holder, args.asked_at), 'KEEPTTL') end
return 1
