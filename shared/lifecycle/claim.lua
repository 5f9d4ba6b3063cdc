-- uses: share_member, clock_ms
-- A worker's pick of jobs, in one call, with the model's queue shared fairly among its tenants:
-- up to `wanted` jobs no other worker has taken, each then claimed, as {id, score, id, score, ...}
-- (the score: the job's submission ms, from the model's queue). A claim is the job's lease, held as
-- `claim:<worker>` for `lease_ms`: the worker's start (`start.lua`) turns it into the run's lease,
-- and a claim whose worker never starts the job lapses, so that another worker picks the job up.
--
-- Start-time fair queuing over the tenants' shares (`ModelKeys.share_*`), counted in tokens as the
-- virtual token counter counts them: every tenant with jobs waiting has a pass, the virtual time of
-- its next job. The tenant with the lowest pass gives a job, and its pass moves on by the job's
-- `cost` (its prompt's tokens, weighted and over the tenant's weight, from its record: written at
-- submission), or by its stride (one over its weight) for a job with no cost; the model's clock
-- becomes the pass just served. The output's tokens are charged once the job has ended: its worker
-- passes (job, output tokens) in `charges` at its next claim, each moving the job's share's pass on
-- by the job's `output_cost` a token (or the pass the share keeps while it waits for nothing). A
-- tenant that joins comes in at the clock, so it is served next however long the others' backlogs,
-- and tenants with backlogs are served tokens in proportion to their weights. Each pick costs a few
-- O(log n) commands.
--
-- Which of a tenant's jobs: its first (lowest priority value, then earliest); with `affinity`, of
-- its head priority, first the one whose prefix this worker holds longest (its `preferred` list of
-- the share, written at submission from the blocks the workers advertised: `submit.lua`,
-- `advertise.lua`), else the first of the head priority's `window` jobs it may take: not one whose
-- prefix another live worker holds, until it has waited `wait_ms` since its submission, and one
-- no live worker holds only where no other worker runs fewer jobs (each worker's count as of its
-- last claim, `ModelKeys.worker_loads`, within `stale_ms`: a full worker claims nothing) or once
-- it has waited as long. A worker with nothing it may take from a tenant's head passes over that
-- tenant in this call, as over one whose jobs other workers have just claimed.
--
-- A job stays in its share until it leaves the model's queue: start and cancel take its entry out
-- (`leave_queue.lua`); an entry whose job left otherwise (its keys expired) is dropped here, and one
-- that another worker has just claimed is passed over. A job in the model's queue and in no share
-- is one whose share expired with it (its keys expired while it waited, and no job of its tenant came
-- since): once no share has anything to give, and no job was left to another worker, up to
-- `read_limit` of those are taken from the queue's head, so that the worker's start finds their jobs
-- gone and drops them from the queue.
-- Two bands, each fair in this way among its shares with a clock of its own: the interactive one
-- (`share_tenants`, clock `clock`), then the batch band (`batch_share_tenants`, clock `batch_clock`:
-- a batch's jobs, `shared.batches`), from which at most `batch_wanted` jobs are taken, and only
-- once no interactive share has a job to give: a batch never goes before interactive work.
-- The leases and shares are named here from prefixes: single-instance Redis, not Redis Cluster.
-- Takes `arguments.ClaimArgs`; KEYS: the model's queue, `share_tenants`, `batch_share_tenants`,
-- `share_state`, `worker_loads`, the workers' heartbeats (`Keys.workers`) and the claiming worker's
-- `worker_blocks`, whose life a claim renews (`advertise.lua`).
local queue, tenants, batch_tenants, state, loads, workers, worker_blocks = unpack(KEYS)
local args = cjson.decode(ARGV[1])
local lease_prefix, lease_suffix, share_prefix = args.lease_prefix, args.lease_suffix, args.share_prefix
local holder = 'claim:' .. args.worker
local room = 2 * args.wanted
local affinity = args.affinity
local SCAN = 16

local claimed = {}
local deferred = false  -- a job was left to another worker: the queue's head is not read below

-- The output tokens of jobs this worker ended since its last claim: each job's record says whose
-- share it waited in and what an output token costs that share (`Tenant.token_costs`).
for _, charge in ipairs(args.charges) do
  local share, per_token = unpack(redis.call('HMGET', args.job_prefix .. charge[1], 'share', 'output_cost'))
  if share and per_token then
    local amount = tonumber(per_token) * charge[2]
    local band = tenants
    if share_band(share) == 'batch' then band = batch_tenants end
    if redis.call('ZSCORE', band, share) then
      redis.call('ZINCRBY', band, amount, share)
    else
      redis.call('HINCRBYFLOAT', state, 'pass:' .. share, amount)
    end
  end
end

-- true: taken; false: another worker claimed it a moment ago; nil: no longer queued.
local function take(id)
  local score = redis.call('ZSCORE', queue, id)
  if not score then return nil end
  if not redis.call('SET', lease_prefix .. id .. lease_suffix, holder, 'PX', args.lease_ms, 'NX') then return false end
  claimed[#claimed + 1] = id
  claimed[#claimed + 1] = score
  return true
end

-- The job taken from a share (its id), or nil with none to take.
local function take_first(share_queue)
  local offset = 0
  while true do
    local got = redis.call('ZRANGE', share_queue, offset, offset + SCAN - 1)
    if #got == 0 then return nil end
    local passed = 0
    for _, member in ipairs(got) do
      local id = share_member_job(member)
      local taken = take(id)
      if taken then return id end
      if taken == nil then redis.call('ZREM', share_queue, member) else passed = passed + 1 end
    end
    offset = offset + passed
  end
end

-- With `affinity`: Redis's clock, and the fewest running jobs of the other workers that claimed
-- lately (their last claim's count; math.huge with none), each read once a call if needed at all.
local now, others_least
local alive = {}
local function clock()
  now = now or clock_ms()
  return now
end

local function least_of_others()
  if others_least then return others_least end
  others_least = math.huge
  local seen = redis.call('HGETALL', loads)
  for i = 1, #seen, 2 do
    if seen[i] ~= args.worker then
      local running, at = string.match(seen[i + 1], '^(%d+):(%d+)$')
      if not at or clock() - tonumber(at) > 100 * affinity.stale_ms then
        redis.call('HDEL', loads, seen[i])  -- a worker long gone
      elseif clock() - tonumber(at) <= affinity.stale_ms then
        others_least = math.min(others_least, tonumber(running))
      end
    end
  end
  return others_least
end

local function is_alive(worker)
  if alive[worker] == nil then
    alive[worker] = (tonumber(redis.call('ZSCORE', workers, worker)) or 0) > clock()
  end
  return alive[worker]
end

-- Whether this worker may take a queued job now: its own, or one that has waited `wait_ms`; else
-- not one whose prefix another live worker holds, and one held nowhere only if no other worker
-- runs fewer jobs.
local function may_take(member)
  local prefer = redis.call('HGET', args.job_prefix .. share_member_job(member), 'prefer')
  if prefer == args.worker then return true end
  if clock() - tonumber(string.sub(member, 1, 15)) >= affinity.wait_ms then return true end
  if prefer and is_alive(prefer) then return false end
  return affinity.running + #claimed / 2 <= least_of_others()
end

-- `take_first` with `affinity`: the job of the share's head priority whose prefix this worker holds
-- longest (its `preferred` set for the share, written at submission: `submit.lua`), else the first
-- of the head priority's `window` jobs it may take; nil with none.
local function take_preferred(tenant, share_queue)
  local preferred = affinity.preferred_prefix .. args.worker .. ':' .. tenant
  while true do
    local head = redis.call('ZRANGE', share_queue, 0, 0, 'WITHSCORES')
    if #head == 0 then return nil end
    local mine = redis.call('ZRANGE', preferred, 0, 0, 'WITHSCORES')
    -- Scored by priority times `scale` less the blocks held: the head priority's, longest first.
    if #mine == 0 or math.ceil(tonumber(mine[2]) / affinity.scale) ~= tonumber(head[2]) then break end
    redis.call('ZREM', preferred, mine[1])  -- taken now, or by another worker, or gone
    local id = share_member_job(mine[1])
    local taken = take(id)
    if taken then return id end
    if taken == nil then redis.call('ZREM', share_queue, mine[1]) end
  end
  local got = redis.call('ZRANGE', share_queue, 0, affinity.window - 1, 'WITHSCORES')
  for i = 1, #got, 2 do
    if got[i + 1] ~= got[2] then break end  -- a later priority: never before the head's
    if may_take(got[i]) then
      local id = share_member_job(got[i])
      local taken = take(id)
      if taken then return id end
      if taken == nil then redis.call('ZREM', share_queue, got[i]) end
    else
      deferred = true
    end
  end
  return nil
end

-- The job's cost against its tenant's share: its record's `cost`, or the tenant's stride.
local function cost(id, tenant)
  local given = redis.call('HGET', args.job_prefix .. id, 'cost')
  if given then return tonumber(given) end
  return tonumber(redis.call('HGET', state, 'stride:' .. tenant)) or 1
end

-- Serve one band's shares (`band`, the sorted set of its tenants; `clock_field`, its clock in
-- `state`) until `#claimed` reaches `up_to`.
local function serve(band, clock_field, up_to)
  local skipped = {}  -- tenants with nothing to give in this call
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
    local id
    if affinity then id = take_preferred(tenant, share_queue) else id = take_first(share_queue) end
    if id then
      -- A pass below the clock is a tenant's that had only just-claimed jobs while others were
      -- served: like a tenant that joins, it starts at the clock and has saved no turns.
      clock = math.max(clock, pass)
      redis.call('ZADD', band, clock + cost(id, tenant), tenant)
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

if #claimed < room and not deferred then
  local head = redis.call('ZRANGE', queue, 0, args.read_limit - 1)
  for _, id in ipairs(head) do
    if #claimed >= room then break end
    -- A batch's job waits in its band's share: never taken here, past the band's bound.
    local share = redis.call('HGET', args.job_prefix .. id, 'share')
    if not share or share_band(share) ~= 'batch' then take(id) end
  end
end
if affinity then
  redis.call('HSET', loads, args.worker, (affinity.running + #claimed / 2) .. ':' .. clock())
  redis.call('PEXPIRE', worker_blocks, affinity.blocks_ttl_ms)
end
return claimed
