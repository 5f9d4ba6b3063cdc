-- Prepended to the scripts that take a job out of its model's queue (start, cancel): the job leaves
-- its tenant's share too (`share_enqueue.lua` wrote its entry from the same record fields), so that
-- the share holds only waiting jobs and a queued job's position counts only those. A job queued
-- before shares existed has none. Expects KEYS[1] to be the job's record.
local function share_leave(share_prefix, id)
  local share, created_at = unpack(redis.call('HMGET', KEYS[1], 'share', 'created_at'))
  if not share then return end
  local member = string.format('%015d:%s', math.floor(tonumber(created_at) * 1000), id)
  redis.call('ZREM', share_prefix .. share, member)
end
