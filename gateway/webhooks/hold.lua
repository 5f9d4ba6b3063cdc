-- A sender holds the entries it read (new ones, or taken over): each one's delivery so far, from its
-- record, and its place in its tenant's index of deliveries under way; then each of those tenants past
-- its bound has its oldest deliveries given up, so that a tenant only ever gives up its own. A given-up
-- entry leaves the stream, the consumer group and the index, and its record says `failed` and why, in
-- one step; an index member whose entry left the stream without it (a gateway that took the owner for
-- another tenant's) is dropped as it comes up.
-- KEYS after the stream: each entry's delivery record, then its tenant's index.
-- ARGV: the group, the bound, the most one tenant gives up in a call (Redis serves no one else
-- meanwhile), the reason, the record names' prefix and suffix around the job id, then the entry ids.
-- Answers each entry's {attempts, next attempt at} (nil: not to hold, finished or gone), then the ids
-- given up.
local stream = KEYS[1]
local group, bound, most, reason, record_prefix, record_suffix = ARGV[1], tonumber(ARGV[2]),
    tonumber(ARGV[3]), ARGV[4], ARGV[5], ARGV[6]
local FIRST_ID = 7

local progress, touched, seen = {}, {}, {}
for i = FIRST_ID, #ARGV do
  local id = ARGV[i]
  local record, index = KEYS[2 * (i - FIRST_ID) + 2], KEYS[2 * (i - FIRST_ID) + 3]
  local status, attempts, next_at = unpack(redis.call('HMGET', record, 'status', 'attempts',
      'next_attempt_at'))
  if #redis.call('XRANGE', stream, id, id) == 0 then
    progress[#progress + 1] = false
  elseif status == 'delivered' or status == 'failed' then  -- its sender went before it dropped it
    redis.call('XACK', stream, group, id)
    redis.call('XDEL', stream, id)
    redis.call('ZREM', index, id)
    progress[#progress + 1] = false
  else
    redis.call('ZADD', index, tonumber(string.match(id, '^%d+')), id)
    if not seen[index] then
      seen[index] = true
      touched[#touched + 1] = index
    end
    progress[#progress + 1] = {attempts or '0', next_at or ''}
  end
end

local given_up = {}
for _, index in ipairs(touched) do
  local excess = math.min(redis.call('ZCARD', index) - bound, most)
  if excess > 0 then
    for _, id in ipairs(redis.call('ZRANGE', index, 0, excess - 1)) do
      redis.call('ZREM', index, id)
      local entry = redis.call('XRANGE', stream, id, id)[1]
      if entry then
        redis.call('XDEL', stream, id)
        redis.call('XACK', stream, group, id)
        local fields = entry[2]
        for f = 1, #fields, 2 do
          if fields[f] == 'job' then
            local record = record_prefix .. fields[f + 1] .. record_suffix
            if redis.call('EXISTS', record) == 1 then
              redis.call('HSET', record, 'status', 'failed', 'last_error', reason, 'next_attempt_at', '')
            end
          end
        end
        given_up[#given_up + 1] = id
      end
    end
  end
end
return {progress, given_up}
