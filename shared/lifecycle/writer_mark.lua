-- uses: lease
-- Data plane, before a cancel's script on the control plane: the writer of a running job carries the
-- ask, as its lease does (`lease.lua`), so that the worker's next step, which reads the writer, ends
-- it cancelled, even should the cancel's caller stop before the record has the ask. The TTL kept; a
-- job without a writer (queued, handed back, ended) is left as it is. Takes
-- `arguments.WriterMarkArgs`. KEYS: the job's writer.
-- Answers 1 when the writer carries the ask (now or already), else 0.
local writer = KEYS[1]
local args = cjson.decode(ARGV[1])
local holder, asked = lease_holder(redis.call('GET', writer))
if not holder then return 0 end
if not asked then redis.call('SET', writer, lease_of(holder, args.asked_at), 'KEEPTTL') end
return 1
