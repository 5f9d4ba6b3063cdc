-- The claim script before fair sharing among tenants (the model's queue read in submission order,
-- as arq reads it), kept as the benchmark's baseline: `bench/fair_share.py` times it beside
-- `shared/lifecycle/claim.lua`. KEYS[1]: the queue; ARGV: now_ms, in_progress_ms, in_progress_prefix,
-- read_limit, wanted.
--
-- arq's poll and its checks, in one call: the due jobs at the head of the queue, and of those the
-- ones no other worker has taken (each then marked in progress), up to `wanted`. Answers
-- {id, score, id, score, ...}. The in-progress keys are named here from arq's prefix:
-- single-instance Redis, not Redis Cluster.
local queue = KEYS[1]
local now_ms, in_progress_ms, in_progress_prefix, read_limit, wanted = unpack(ARGV)

local due = redis.call('ZRANGEBYSCORE', queue, '-inf', now_ms, 'WITHSCORES', 'LIMIT', 0, read_limit)
local claimed = {}
for i = 1, #due, 2 do
  if #claimed >= 2 * tonumber(wanted) then break end
  local in_progress = in_progress_prefix .. due[i]
  if redis.call('EXISTS', in_progress) == 0 then
    redis.call('PSETEX', in_progress, in_progress_ms, '1')
    claimed[#claimed + 1] = due[i]
    claimed[#claimed + 1] = due[i + 1]
  end
end
return claimed
