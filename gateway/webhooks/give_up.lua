-- Give up deliveries still under way (the oldest, when the webhooks stream holds more than its bound):
-- each entry leaves the stream and the consumer group, and its record says `failed` and why, in one
-- step. One that a sender finished meanwhile (no longer in the stream) is left as its record says.
-- KEYS after the stream: each entry's delivery record; ARGV: the group, the reason, then the entry ids.
local stream, group, reason = KEYS[1], ARGV[1], ARGV[2]
local FIRST_ID = 3

local given_up = 0
for i = FIRST_ID, #ARGV do
  if redis.call('XDEL', stream, ARGV[i]) == 1 then
    redis.call('XACK', stream, group, ARGV[i])
    local record = KEYS[i - FIRST_ID + 2]
    if redis.call('EXISTS', record) == 1 then
      redis.call('HSET', record, 'status', 'failed', 'last_error', reason, 'next_attempt_at', '')
    end
    given_up = given_up + 1
  end
end
return given_up
