-- Record a failed attempt of a delivery still under way (its record says `pending`): one given up
-- meanwhile (past its tenant's bound: `hold.lua`) keeps the record its give-up wrote, reason included,
-- and one whose record expired is not written again in part.
-- KEYS: the delivery record. ARGV: its TTL, then field, value pairs.
local record = KEYS[1]
if redis.call('HGET', record, 'status') ~= 'pending' then return 0 end
redis.call('HSET', record, unpack(ARGV, 2))
redis.call('EXPIRE', record, ARGV[1])
return 1
