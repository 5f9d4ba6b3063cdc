-- uses: clock_ms
-- Called by the scripts that write job streams. An event's stream id is '<seq>-1', made of its seq:
-- an event written twice (a step sent again after a round trip that failed, or written again on a
-- new master after a failover lost it) takes the id it had, so a cursor names the same event on
-- every master and no reader is handed an event twice. (0-0 is no stream id, hence the '-1'; a
-- cursor '<seq>' or '<seq>-0' is just before that event.) Each entry also keeps `at`, when it was
-- written in ms, for the gateway's relay lag: the step's sending by its worker's clock (a step is
-- the hot path, and reading Redis's clock there costs more than the rest of the append), else
-- Redis's.

-- Whether a stream entry (as XRANGE answers it: its type the first field) is a job's last event.
local TERMINAL_TYPES = {done = true, cancelled = true, error = true}
local function is_terminal(entry)
  return TERMINAL_TYPES[entry[2][2]] == true
end

-- The seq of the stream's last event: -1 for none.
local function last_seq(stream)
  local last = redis.call('XREVRANGE', stream, '+', '-', 'COUNT', 1)[1]
  if not last then return -1 end
  return tonumber(string.match(last[1], '^(%d+)'))
end

-- An event's seq, read from its JSON as the event models write it (type, then seq) without
-- decoding the rest (a delta's logprobs can be large).
local function event_seq(data)
  return tonumber(string.match(data, '^{"type":"[%a_]+","seq":(%d+)')) or cjson.decode(data)['seq']
end

-- Whether a stream whose last event is `last` (`last_seq`) lacks events sent before the event
-- `data` (a failover's new master had not received them): its writer must send those first.
local function is_behind(last, data)
  return event_seq(data) > last + 1
end

-- XADD through `call` (redis.call, or redis.pcall to have a refusal answered rather than raised).
-- `maxlen` false: the stream cannot pass its cap with this event (its seq is below it, and a stream
-- holds no more events than its last seq + 1), so it is not trimmed, which spares three arguments.
-- `existing`: only to a stream that exists (NOMKSTREAM): Redis answers nil (false here) rather than
-- make the stream, which would then have no TTL.
local function xadd(call, stream, existing, maxlen, id, kind, data, at)
  if not at then at = string.format('%d', clock_ms()) end
  if existing then
    if not maxlen then return call('XADD', stream, 'NOMKSTREAM', id, 'type', kind, 'data', data, 'at', at) end
    return call('XADD', stream, 'NOMKSTREAM', 'MAXLEN', '~', maxlen, id, 'type', kind, 'data', data, 'at', at)
  end
  if not maxlen then return call('XADD', stream, id, 'type', kind, 'data', data, 'at', at) end
  return call('XADD', stream, 'MAXLEN', '~', maxlen, id, 'type', kind, 'data', data, 'at', at)
end

-- The seq of an event's stream id ('<seq>-1').
local function id_seq(id)
  return tonumber(string.match(id, '^(%d+)'))
end

-- Append an event under its stream id `id` unless the stream holds its seq already, and answer the
-- seq of the stream's last event after it, and whether the event was appended. `last` is that seq
-- before (`last_seq`), or nil when it was not read: an event sent for the first time is new, so the
-- stream is read only should Redis refuse the event's id (the stream holds the event after all),
-- and stays unread (nil) while every event is new. `at`: when the event was sent (ms), nil for now
-- by Redis's clock. `existing` (`xadd`): answers false, false when the stream does not exist, and
-- nothing is written.
local function append_at(stream, maxlen, last, id, kind, data, at, existing)
  if last == nil then
    local added = xadd(redis.pcall, stream, existing, maxlen, id, kind, data, at)
    if type(added) == 'string' then return nil, true end
    if not added then return false, false end
    last = last_seq(stream)  -- refused: the stream holds the id already
  end
  local seq = id_seq(id)
  if seq <= last then return last, false end
  if not xadd(redis.call, stream, existing, maxlen, id, kind, data, at) then return false, false end
  return seq, true
end

-- `append_at` for an event whose id is made from its JSON's seq.
local function append_event(stream, maxlen, last, kind, data, at)
  return append_at(stream, maxlen, last, string.format('%d-1', event_seq(data)), kind, data, at)
end
