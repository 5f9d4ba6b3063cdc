#!lua flags=no-writes
-- no-writes: Redis runs it when out of memory, as it runs plain reads (it refuses a script that may write).
-- A reader's check of its cursor on a job (the gateway's `Relay.check`, before every page and every
-- follow), and a long-poll page's read: the job's status and owner; of its stream only what the
-- cursor needs, the last id it generated and whether it lost entries the cursor has not had; and the
-- first `args.count` entries after the cursor. XINFO STREAM answers the second but with the stream's
-- first and last entries whole; here the stream's two ends are read, and XINFO only where they do not
-- settle it: a cursor before the first entry (were entries trimmed off the head?), one past the last
-- (only XINFO knows the last id generated), or a stream without entries. A cursor at the last entry
-- needs the last alone.
-- With the stream on a Redis of its own (`Transitions`), KEYS is the stream alone (a key of another
-- slot would be refused by a Redis Cluster) and the caller reads the record elsewhere: the status answered is then 'ended' when the stream's last entry is a terminal
-- event, else '', and the owner ''.
-- `args.cursor`: the cursor as '<ms>-<seq>' in plain decimals. Answers false for no record,
-- {status, owner} for a record without a stream, else {status, owner, last generated id, oldest,
-- entries}: `oldest` the first entry kept when the stream has lost entries after the cursor (the
-- cursor is too old, and nothing is read), else ''.
local record, stream = unpack(KEYS)
if #KEYS == 1 then record, stream = '', KEYS[1] end
local args = cjson.decode(ARGV[1])
local cursor = args.cursor
local TERMINAL = {done = true, cancelled = true, error = true}  -- `append_event.lua`'s: no helper in a read

-- Whether the decimal `a` is below `b`, both without leading zeros (an id's parts are 64-bit, past
-- what a Lua number holds exactly).
local function below(a, b)
  return #a < #b or (#a == #b and a < b)
end

-- Whether the stream id `a` comes before `b`.
local function before(a, b)
  local a_ms, a_seq = string.match(a, '^(%d+)-(%d+)$')
  local b_ms, b_seq = string.match(b, '^(%d+)-(%d+)$')
  if a_ms ~= b_ms then return below(a_ms, b_ms) end
  return below(a_seq, b_seq)
end

local status, owner = '', ''
if record ~= '' then
  status, owner = unpack(redis.call('HMGET', record, 'status', 'owner'))
  if not status then return false end
end
local last = redis.call('XREVRANGE', stream, '+', '-', 'COUNT', 1)[1]
if record == '' and last and TERMINAL[last[2][2]] then status = 'ended' end
-- A cursor at the last entry (a poll at the tip, the most common) has nothing to read, and has lost
-- nothing: entries are only ever trimmed off a stream's head (MAXLEN), never deleted, so its last
-- entry is the last it generated.
if last and last[1] == cursor then return {status, owner, cursor, '', {}} end

-- The entries after the cursor, where it is not at the stream's last id (from which none follow).
local function after(last_id)
  if args.count == 0 or not before(cursor, last_id) then return {} end
  return redis.call('XRANGE', stream, '(' .. cursor, '+', 'COUNT', args.count)
end

local first = redis.call('XRANGE', stream, '-', '+', 'COUNT', 1)[1]
if first and not before(cursor, first[1]) and before(cursor, last[1]) then
  return {status, owner, last[1], '', after(last[1])}
end
local info = redis.pcall('XINFO', 'STREAM', stream)
if info.err then return {status, owner} end
local fields = {}
for i = 1, #info, 2 do fields[info[i]] = info[i + 1] end
local generated = fields['last-generated-id']
if first and fields['entries-added'] > fields['length'] and before(cursor, first[1]) then
  return {status, owner, generated, first[1], {}}
end
return {status, owner, generated, '', after(generated)}
