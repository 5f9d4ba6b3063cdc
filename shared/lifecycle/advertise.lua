-- uses: clock_ms
-- A worker tells which prefix blocks its engine's cache now holds: the block hashes of a prompt it
-- has just started (`shared.prefix_blocks`), so that the next job with that prefix is claimed by it
-- (`claim.lua`, through the `prefer` that `submit.lua` finds with `prefix_holder.lua`). The model's
-- `prefix_blocks` maps each block to the worker that ran it last; the worker's own `worker_blocks`
-- keeps its blocks by when they were last used, at most `capacity` (its cache's blocks): the least
-- recently used go first, a prompt's later blocks before its earlier ones (as vLLM evicts), and
-- leave the model's map where it still names this worker. The worker's set lives `ttl_ms`, renewed
-- by its claims; a worker that died holds nothing whatever its set says (its heartbeat lapsed), and
-- `prefix_holder.lua` drops the map's entries that name it as it meets them. Takes `arguments.AdvertiseArgs`; KEYS: the model's
-- `prefix_blocks`, the worker's `worker_blocks`.
local index, held = unpack(KEYS)
local args = cjson.decode(ARGV[1])
local blocks = args.blocks
local now_us = clock_us()
local scored, named = {}, {}
for i, block in ipairs(blocks) do
  scored[#scored + 1] = now_us - i
  scored[#scored + 1] = block
  named[#named + 1] = block
  named[#named + 1] = args.worker
end
if #blocks > 0 then
  redis.call('ZADD', held, unpack(scored))
  redis.call('HSET', index, unpack(named))
end
local over = redis.call('ZCARD', held) - args.capacity
if args.capacity > 0 and over > 0 then
  local popped = redis.call('ZPOPMIN', held, over)  -- member, score, member, score, ...
  for i = 1, #popped, 2 do
    if redis.call('HGET', index, popped[i]) == args.worker then redis.call('HDEL', index, popped[i]) end
  end
end
redis.call('PEXPIRE', held, args.ttl_ms)
redis.call('PEXPIRE', index, args.index_ttl_ms)
return #blocks
