-- uses: share_member
-- A worker's pick of jobs, in one call, with the model's queue shared fairly among its tenants:
-- up to `wanted` jobs no other worker has taken, each then claimed, as {id, score, id, score, ...}
-- (the score: the job's submission ms, from the model's queue). A claim is the job's lease, held as
-- `claim:<worker>` for `lease_ms`: the worker's start (`start.lua`) turns it into the run's lease,
-- and a claim whose worker never starts the job lapses, so that another worker picks the job up.
--
-- Start-time fair queuing over the tenants' shares (`ModelKeys.share_*`): every tenant with jobs
-- waiting has a pass, the virtual time of its next job. The tenant with the lowest pass gives its
-- first job (lowest priority value, then earliest), and its pass moves on by its stride, one over
-- its weight; the model's clock becomes the pass just served. A tenant that joins comes in at the
-- clock, so it is served next however long the others' backlogs, and tenants with backlogs are
-- served in proportion to their weights. Each pick costs a few O(log n) commands.
--
-- A job stays in its share until it leaves the model's queue: start and cancel take its entry out
-- (`leave_queue.lua`); an entry whose job left otherwise (its keys expired) is dropped here, and one
-- that another worker has just claimed is passed over. A job in the model's queue and in no share
-- is one whose share expired with it (its keys expired while it waited, and no job of its tenant came
-- since): once no share has anything to give, up to `read_limit` of those are taken from the queue's
-- head, so that the worker's start finds their jobs gone and drops them from the queue.
-- Two bands, each fair in this way among its shares with a clock of its own: the interactive one
-- (`share_tenants`, clock `clock`), then the batch band (`batch_share_tenants`, clock `batch_clock`:
-- a batch's jobs, `shared.batches`), from which at most `batch_wanted` jobs are taken, and only
-- once no interactive share has a job to give: a batch never goes before interactive work.
-- The leases and shares are named here from prefixes: single-instance Redis, not Redis Cluster.
-- Takes `arguments.ClaimArgs`.
local queue, tenants, batch_tenants, state = unpack(KEYS)
local args = cjson.decode(ARGV[1])
local lease_prefix, lease_suffix, share_prefix = args.lease_prefix, args.lease_suffix, args.share_prefix
local holder = 'claim:' .. args.worker
local room = 2 * args.wanted
local SCAN = 16

local claimed = {}

-- true: taken; false: another worker claimed it a moment ago; nil: no longer queued.
local function take(id)
  local score = redis.call('ZSCORE', queue, id)
  if not score then return nil end
  if not redis.call('SET', lease_prefix .. id .. lease_suffix, holder, 'PX', args.lease_ms, 'NX') then return false end
  claimed[#claimed + 1] = id
  claimed[#claimed + 1] = score
  return true
end

local function take_first(share_queue)
  local offset = 0
  while true do
    local got = redis.call('ZRANGE', share_queue, offset, offset + SCAN - 1)
    if #got == 0 then return false end
    local passed = 0
    for _, member in ipairs(got) do
      local taken = take(share_member_job(member))
      if taken then return true end
      if taken == nil then redis.call('ZREM', share_queue, member) else passed = passed + 1 end
    end
    offset = offset + passed
  end
end

-- Serve one band's shares (`band`, the sorted set of its tenants; `clock_field`, its clock in
-- `state`) until `#claimed` reaches `up_to`.
local function serve(band, clock_field, up_to)
  local skipped = {}  -- tenants with nothing to give in this call (only jobs just claimed elsewhere)
  local clock_was = tonumber(redis.call('HGET', state, clock_field)) or 0
  local clock = clock_was

  local function lowest_tenant()
    local offset = 0
    while true do
      local got = redis.call('ZRANGE', band, offset, offset + SCAN - 1, 'WITHSCORES')
      if #got == 0 then return nil end
      for i = 1, #got, 2 do
        if not skipped[got[i]] then return got[i], tonumber(got[i + 1]) end
      end
      offset = offset + SCAN
    end
  end

  while #claimed < up_to do
    local tenant, pass = lowest_tenant()
    if not tenant then break end
    local share_queue = share_prefix .. tenant
    if take_first(share_queue) then
      -- A pass below the clock is a tenant's that had only just-claimed jobs while others were
      -- served: like a tenant that joins, it starts at the clock and has saved no turns.
      clock = math.max(clock, pass)
      local stride = tonumber(redis.call('HGET', state, 'stride:' .. tenant)) or 1
      redis.call('ZADD', band, clock + stride, tenant)
    else
      if redis.call('EXISTS', share_queue) == 0 then
        redis.call('ZREM', band, tenant)
        redis.call('HSET', state, 'pass:' .. tenant, pass)
      end
      skipped[tenant] = true
    end
  end
  if clock ~= clock_was then redis.call('HSET', state, clock_field, clock) end
end

serve(tenants, 'clock', room)
if #claimed < room and args.batch_wanted > 0 then
  serve(batch_tenants, 'batch_clock', math.min(room, #claimed + 2 * args.batch_wanted))
end

if #claimed < room then
  local head = redis.call('ZRANGE', queue, 0, args.read_limit - 1)
  for _, id in ipairs(head) do
    if #claimed >= room then break end
    -- A batch's job waits in its band's share: never taken here, past the band's bound.
    local share = redis.call('HGET', args.job_prefix .. id, 'share')
    if not share or share_band(share) ~= 'batch' then take(id) end
  end
end
return claimed
