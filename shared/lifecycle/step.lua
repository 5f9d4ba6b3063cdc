-- uses: append_event
-- running -> running, for each of a worker's jobs that took an engine step: append the step's
-- events if this worker still holds the job's lease and its record still exists, then check its
-- cancel key. One call carries every step of a worker's round trip, whatever the number of jobs:
-- Redis's cost of a call is paid once a round trip, not once a job. Answers one verdict a job, in
-- the order sent: 'go', 'lost' (another worker holds the job now, or its keys expired: nothing is
-- appended), {'behind', the seq of the stream's last event} (the stream lacks events sent before
-- this step's: a failover's new master had not received the job's last steps; nothing is appended)
-- or {'cancel', when the cancel was asked for}.
-- A job's `check` is '' for a step sent after its job's last step was answered with no Redis
-- failure between: its stream cannot have lost anything, and is not read. Otherwise (a step sent
-- again, or the first of its job since a round trip failed) the stream is read first: the script
-- is atomic, so it holds either all of a step sent before or none, and events it holds (by seq:
-- `append_event.lua`) are not appended twice.
-- `sent_at`: when the worker sent the steps, in ms by its clock (each entry's `at`). `notice`: the
-- message that tells the gateways' stream readers what the call appended (`Keys.notices`), made
-- by the worker as if every event of the call is appended: a line per entry, the entry itself
-- (`shared.notices.notice_line`), for the readers to relay as it is. It goes out as it came when every
-- event was appended, as at nearly every step, and costs Redis no more than its sending; else the
-- message names the streams appended to, a line each, and the readers read them.
-- The one script with positional ARGV, as `arguments.StepArgs` names the first ones (it runs for
-- every running job at every engine step, and decoding a table would cost more than the rest of
-- it); then per job, in the order of its four KEYS (stream, cancel, lease, record): its `check`,
-- its number of events, and (type, data) per event.
local worker, maxlen, sent_at, notices, notice = unpack(ARGV, 1, 5)
local FIRST_JOB = 6
local advanced = {}  -- the streams appended to
local whole = true  -- every event of the call was appended: `notice` tells it all

local function step(stream, cancel, lease, record, check, first, last_arg)
  if redis.call('GET', lease) ~= worker or redis.call('EXISTS', record) == 0 then
    whole = false
    return 'lost'
  end
  local last = nil
  if check ~= '' then
    last = last_seq(stream)
    if last_arg > first and is_behind(last, ARGV[first + 1]) then
      whole = false
      return {'behind', last}
    end
  end
  local appended, any = false, false
  for i = first, last_arg, 2 do
    last, appended = append_event(stream, maxlen, last, ARGV[i], ARGV[i + 1], sent_at)
    if appended then any = true else whole = false end
  end
  if any then advanced[#advanced + 1] = stream end
  local asked = redis.call('GET', cancel)
  if asked then return {'cancel', asked} end
  return 'go'
end

local answers = {}
local at = FIRST_JOB
for job = 1, #KEYS / 4 do
  local keys = 4 * (job - 1)
  local first = at + 2
  local last_arg = first + 2 * tonumber(ARGV[at + 1]) - 1
  answers[job] = step(KEYS[keys + 1], KEYS[keys + 2], KEYS[keys + 3], KEYS[keys + 4], ARGV[at], first, last_arg)
  at = last_arg + 1
end
if whole and notice ~= '' then
  redis.call('PUBLISH', notices, notice)
elseif #advanced > 0 then
  redis.call('PUBLISH', notices, table.concat(advanced, '\n'))
end
return answers
