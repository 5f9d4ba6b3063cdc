-- uses: append_event
-- running -> running: append a step's events if this worker still holds the lease and the job's
-- record still exists, then check the cancel key. Answers 'go', 'lost' (another worker holds the
-- job now, or its keys expired: nothing is appended), {'behind', the seq of the stream's last event}
-- (the stream lacks events sent before this step's: a failover's new master had not received the
-- job's last steps; nothing is appended) or {'cancel', when the cancel was asked for}.
-- `check` is '' for a step sent after its job's last step was answered with no Redis failure
-- between: its stream cannot have lost anything, and is not read. Otherwise (a step sent again, or
-- the first of its job since a round trip failed) the stream is read first: the script is atomic, so
-- it holds either all of a step sent before or none, and events it holds (by seq:
-- `append_event.lua`) are not appended twice.
-- `sent_at`: when the worker sent the step, in ms by its clock (each entry's `at`).
-- The one script with positional ARGV, as `arguments.StepArgs` names them (it runs once per running
-- job per engine step, and decoding a table would cost more than the rest of it); (type, data) per
-- event follow them.
local stream, cancel, lease, record = unpack(KEYS)
local worker, maxlen, check, sent_at = unpack(ARGV, 1, 4)
local FIRST_EVENT = 5

if redis.call('GET', lease) ~= worker or redis.call('EXISTS', record) == 0 then return 'lost' end
local last = nil
if check ~= '' then
  last = last_seq(stream)
  if #ARGV > FIRST_EVENT and is_behind(last, ARGV[FIRST_EVENT + 1]) then return {'behind', last} end
end
for i = FIRST_EVENT, #ARGV, 2 do last = append_event(stream, maxlen, last, ARGV[i], ARGV[i + 1], sent_at) end
local asked = redis.call('GET', cancel)
if asked then return {'cancel', asked} end
return 'go'
