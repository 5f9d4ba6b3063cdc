-- uses: append_event, read_keys, lease
-- running -> running, for each of a worker's jobs that took an engine step: append the step's
-- events if this worker still holds the job's lease and its stream still exists, and say whether
-- a cancel was asked for (the lease carries it: `lease.lua`). One call carries every step of a
-- worker's round trip, whatever the number of jobs: Redis's cost of a call is paid once a round
-- trip, not once a job.
-- Answers one verdict a job, in the order sent: 'go', 'lost' (another worker holds the job now, or
-- its keys expired: nothing is appended), {'behind', the seq of the stream's last event} (the
-- stream lacks events sent before this step's: a failover's new master had not received the job's
-- last steps; nothing is appended) or {'cancel', when the cancel was asked for}.
-- A job's `check` is '' for a step sent after its job's last step was answered with no Redis
-- failure between: its stream cannot have lost anything, and is not read. Otherwise (a step sent
-- again, or the first of its job since a round trip failed) the stream is read first: the script
-- is atomic, so it holds either all of a step sent before or none, and events it holds (by seq:
-- `append_event.lua`) are not appended twice.
-- `sent_at`: when the worker sent the steps, in ms by its clock (each entry's `at`). `notices`: how
-- many (channel, message) pairs follow, the messages that tell the gateways' stream readers what
-- the call appended, one a notice partition (`Keys.notice_channel`), made by the worker as if every
-- event of the call is appended: a line per entry, the entry itself (`shared.notices.notice_line`),
-- for the readers to relay as it is. They go out as they came when every event was appended, as at
-- nearly every step, and cost Redis no more than their sending; else each channel is told the names
-- of the streams appended to, a line each (those of other partitions too: a reader skips a stream it
-- does not watch), and the readers read them.
-- Every job's lease is read by one MGET, before any append, rather than by a command a job: the
-- script is atomic, so what they hold then is what they hold at the appends, a cancel asked for
-- included. A job's record is not read: its record and stream are given their TTL by the same
-- scripts and expire together, and the appends are made only to a stream that exists (NOMKSTREAM:
-- one made anew would have no TTL), so a job whose stream is gone is 'lost', with nothing written.
-- A step with no events writes nothing, and a job whose keys expired learns it at its next event.
-- KEYS: every job's lease, then every job's stream, each in the jobs' order. The one script with
-- positional ARGV, as `arguments.StepArgs` names the first ones (it runs for every running job at
-- every engine step, and decoding a table would cost more than the rest of it); then the notices;
-- then per job, in the same order: its `check`, its `trim` ('' when every event's seq is below
-- `maxlen`: its stream cannot pass the cap, and is not trimmed), its number of events, and (stream
-- id, type, data) per event. The worker sends each event's id ('<seq>-1', `append_event.lua`): an
-- event sent for the first time, as at nearly every step, is appended with no reading of its JSON,
-- and only a stream that is read compares seqs.
local worker, maxlen, sent_at, publish, notices = unpack(ARGV, 1, 5)
local FIRST_NOTICE = 6
local FIRST_JOB = FIRST_NOTICE + 2 * tonumber(notices)
local jobs = #KEYS / 2  -- job n: lease KEYS[n], stream KEYS[jobs + n]
local leases = get_keys(1, jobs)
local advanced = {}  -- the streams appended to
local whole = true  -- every event of the call was appended: `notice` tells it all

-- Append events first..last_arg of a job (id, type, data each) to `stream`, whose last event's seq
-- is `last`, or nil when not read (`append_at`); answers whether any was appended, or nil when the
-- stream does not exist (nothing appended: only the first append can meet that, the call being atomic).
local function append(stream, cap, last, first, last_arg)
  local any, appended = false, false
  for i = first, last_arg, 3 do
    last, appended = append_at(stream, cap, last, ARGV[i], ARGV[i + 1], ARGV[i + 2], sent_at, true)
    if last == false then return nil end
    if appended then any = true else whole = false end
  end
  return any
end

local function step(job, check, trim, first, last_arg)
  local lease, asked = leases[job], nil
  if lease ~= worker then  -- lost, or a cancel asked for
    local holder
    holder, asked = lease_holder(lease)
    if holder ~= worker then
      whole = false
      return 'lost'
    end
  end
  local stream = KEYS[jobs + job]
  local last = nil
  if check ~= '' then
    last = last_seq(stream)
    if last < 0 and redis.call('EXISTS', stream) == 0 then
      whole = false
      return 'lost'
    end
    if last_arg > first and id_seq(ARGV[first]) > last + 1 then
      whole = false
      return {'behind', last}
    end
  end
  local appended = append(stream, trim ~= '' and maxlen, last, first, last_arg)
  if appended == nil then
    whole = false
    return 'lost'
  end
  if appended then advanced[#advanced + 1] = stream end
  if asked then return {'cancel', asked} end
  return 'go'
end

local answers = {}
local at = FIRST_JOB
for job = 1, jobs do
  local first = at + 3
  local last_arg = first + 3 * tonumber(ARGV[at + 2]) - 1
  answers[job] = step(job, ARGV[at], ARGV[at + 1], first, last_arg)
  at = last_arg + 1
end
if whole then
  for i = FIRST_NOTICE, FIRST_JOB - 1, 2 do redis.call(publish, ARGV[i], ARGV[i + 1]) end
elseif #advanced > 0 then
  local names = table.concat(advanced, '\n')
  for i = FIRST_NOTICE, FIRST_JOB - 1, 2 do redis.call(publish, ARGV[i], names) end
end
return answers
