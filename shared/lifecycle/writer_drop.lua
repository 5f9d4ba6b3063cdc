-- uses: lease
-- Data plane, once a job is taken from a worker (handed back, its lease lapsed, or about to end
-- without it): that worker's writer goes, so that none of its steps still on the way appends
-- anything; a later worker's writer stays. `lifetime` (when given): the stream lives that many
-- seconds from now, for the job's wait in the queue. Takes `arguments.WriterDropArgs`. KEYS: the
-- job's writer and stream. Answers 1 when the writer was `holder`'s, else 0.
local writer, stream = unpack(KEYS)
local args = cjson.decode(ARGV[1])
if args.lifetime then redis.call('EXPIRE', stream, args.lifetime) end
if lease_holder(redis.call('GET', writer)) ~= args.holder then return 0 end
redis.call('DEL', writer)
return 1
