-- A sender keeps the deliveries it holds (sending, or waiting to retry): each entry this consumer
-- still owns in the group has its idle time reset, so that no other gateway takes it over. One that
-- another gateway took meanwhile (this one could not reach Redis for longer than the takeover time)
-- stays with that gateway. ARGV after the group and consumer: entry ids.
-- Answers the ids this consumer no longer owns.
local stream = KEYS[1]
local group, consumer = ARGV[1], ARGV[2]
local FIRST_ID = 3

local lost = {}
for i = FIRST_ID, #ARGV do
  local id = ARGV[i]
  if #redis.call('XPENDING', stream, group, id, id, 1, consumer) == 1 then
    redis.call('XCLAIM', stream, group, consumer, 0, id, 'JUSTID')
  else
    lost[#lost + 1] = id
  end
end
return lost
