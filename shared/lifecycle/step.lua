-- running -> running: append a step's events if this worker still holds the lease and the job's
-- record still exists, then check the cancel key. Answers 'go', 'lost' (another worker holds the
-- job now, or its keys expired: nothing is appended) or {'cancel', when the cancel was asked for}.
-- `resent_from` is '' when a step is first sent. A step sent again after a round trip that failed
-- gives its first event's seq: the script is atomic, so the stream holds either all of that step's
-- events or none, and its last entry's seq tells which (read only then: most steps pay nothing).
-- ARGV after the first three: (type, data) pairs.
local stream, cancel, lease, record = unpack(KEYS)
local worker, maxlen, resent_from = ARGV[1], ARGV[2], ARGV[3]
local first_event = 4

if redis.call('GET', lease) ~= worker or redis.call('EXISTS', record) == 0 then return 'lost' end
if resent_from ~= '' then
  local last = redis.call('XREVRANGE', stream, '+', '-', 'COUNT', 1)[1]
  -- an entry's fields are {'type', type, 'data', data}
  if last and cjson.decode(last[2][4])['seq'] >= tonumber(resent_from) then first_event = #ARGV + 1 end
end
for i = first_event, #ARGV, 2 do
  redis.call('XADD', stream, 'MAXLEN', '~', maxlen, '*', 'type', ARGV[i], 'data', ARGV[i + 1])
end
local asked = redis.call('GET', cancel)
if asked then return {'cancel', asked} end
return 'go'
