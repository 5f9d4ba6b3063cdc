-- The live worker that holds the longest prefix of a prompt, and how many of its blocks, from the
-- model's `prefix_blocks` (`advertise.lua`): `blocks` are the prompt's leading block hashes in order,
-- and a block's hash covers every block before it (vLLM's chained hashing), so the blocks a worker
-- holds of a prompt are a prefix of them, found by bisection in O(log n) reads. An entry naming a
-- worker whose heartbeat has lapsed (`workers`: ids scored by when their heartbeat expires) is
-- dropped. Answers nil, 0 where no live worker holds the first block.
local function prefix_holder(index, workers, blocks, now)
  local held, holder = 0, nil
  local low, high = 1, #blocks
  while low <= high do
    local middle = math.floor((low + high) / 2)
    local worker = redis.call('HGET', index, blocks[middle])
    if worker and (tonumber(redis.call('ZSCORE', workers, worker)) or 0) <= now then
      redis.call('HDEL', index, blocks[middle])
      worker = nil
    end
    if worker then
      held, holder = middle, worker
      low = middle + 1
    else
      high = middle - 1
    end
  end
  return holder, held
end
