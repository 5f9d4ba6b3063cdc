-- uses: append_event, lease
-- Data plane, every end of a job: append its last `events` (the terminal one last), end its writer
-- and have the stream expire after the retention. A worker's end (`holder` its id) comes before the
-- record's and only while the worker still holds the writer; it is refused when the stream lacks
-- events before these (a failover's new master had not received the job's last steps: `step.lua`).
-- Any other end (a cancel, a deadline, a job out of attempts: `holder` absent) comes after the
-- record's, once no worker holds the job; should a worker have taken the writer since (a start that
-- reached the stream late), its writer carries the cancel instead (`lease.lua`) and nothing is
-- appended: its next step ends the stream. Events the stream holds already (an end sent again) are
-- not appended twice. Takes `arguments.StreamEndArgs`. KEYS: the job's stream and writer.
-- Answers {'ended'}, {'lost'} (the holder's writer is gone, or the stream), {'behind', last seq},
-- {'taken'} or {'missing'} (no stream: the job's keys expired).
local stream, writer = unpack(KEYS)
local args = cjson.decode(ARGV[1])

local held = redis.call('GET', writer)
if args.holder then
  if not lease_held_by(held, args.holder) then
    -- Its end sent again, after the first sending reached the stream (and ended the writer):
    -- the stream's last entry is the end's own.
    local last = redis.call('XREVRANGE', stream, '+', '-', 'COUNT', 1)[1]
    local terminal = args.events[#args.events]
    if last and terminal and id_seq(last[1]) == event_seq(terminal[2]) and last[2][2] == terminal[1] then
      return {'ended'}
    end
    return {'lost'}
  end
elseif held then
  local holder, asked = lease_holder(held)
  if not asked then redis.call('SET', writer, lease_of(holder, args.asked_at), 'KEEPTTL') end
  return {'taken'}
end
local last = last_seq(stream)
if last < 0 and redis.call('EXISTS', stream) == 0 then return {args.holder and 'lost' or 'missing'} end
if args.holder and #args.events > 0 and is_behind(last, args.events[1][2]) then return {'behind', last} end
for _, event in ipairs(args.events) do last = append_event(stream, args.maxlen, last, event[1], event[2]) end
redis.call('DEL', writer)
redis.call('EXPIRE', stream, args.retention)
redis.call(args.publish, args.notices, stream)
return {'ended'}
