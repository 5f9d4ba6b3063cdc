-- A job's place in its model's queue and in its tenant's share of it, written here alone (and in
-- `shared.keys.share_member`, which finds a queued job's position): the queue scores a job by its
-- submission time in ms, from its record's `created_at` (seconds); a share's member is that time
-- (15 digits, so that the members of one priority sort by age), ':', then the job's id.
local function queued_ms(created_at)
  return math.floor(tonumber(created_at) * 1000)
end

local function share_member(created_at, id)
  return string.format('%015d:%s', queued_ms(created_at), id)
end

-- The id of the job a share's member names.
local function share_member_job(member)
  return string.sub(member, 17)  -- after '<15 digits>:'
end

-- The band a share serves in: 'batch' for a batch's jobs (`batch:<tenant>`), else 'interactive'.
local function share_band(share)
  if string.sub(share, 1, 6) == 'batch:' then return 'batch' end
  return 'interactive'
end
