-- running -> running: append a step's events if this worker still holds the lease and the job's
-- record still exists, then check the cancel key. Answers 'go', 'lost' (another worker holds the
-- job now, or its keys expired: nothing is appended), {'behind', the seq of the stream's last event}
-- (the stream lacks events sent before this step's: a failover's new master had not received the
-- job's last steps; nothing is appended) or {'cancel', when the cancel was asked for}.
-- A step sent again after a round trip that failed may have reached the stream: the script is
-- atomic, so the stream holds either all of its events or none, and events it holds (by seq:
-- `append_event.lua`) are not appended twice.
-- ARGV after the first two: (type, data) pairs.
local stream, cancel, lease, record = unpack(KEYS)
local worker, maxlen = ARGV[1], ARGV[2]
local FIRST_EVENT = 3

if redis.call('GET', lease) ~= worker or redis.call('EXISTS', record) == 0 then return 'lost' end
local last = last_seq(stream)
if #ARGV > FIRST_EVENT and is_behind(last, ARGV[FIRST_EVENT + 1]) then return {'behind', last} end
for i = FIRST_EVENT, #ARGV, 2 do last = append_event(stream, maxlen, last, ARGV[i], ARGV[i + 1]) end
local asked = redis.call('GET', cancel)
if asked then return {'cancel', asked} end
return 'go'
