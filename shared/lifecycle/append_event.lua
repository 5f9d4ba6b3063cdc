-- Prepended to the scripts that write job streams. An event's stream id is '<seq>-1', made of its
-- seq: an event written twice (a step sent again after a round trip that failed, or written again
-- on a new master after a failover lost it) takes the id it had, so a cursor names the same event
-- on every master and no reader is handed an event twice. (0-0 is no stream id, hence the '-1'; a
-- cursor '<seq>' or '<seq>-0' is just before that event.) Each entry also keeps `at`, Redis's
-- clock in ms when it was written, for the gateway's relay lag. A stream written before its ids
-- were seqs (ids in ms since the epoch, far above any seq) is appended to as it was, with '*'.
local TIME_IDS_FROM = 1e12

-- The seq of the stream's last event: -1 for none, nil for a stream whose ids are times.
local function last_seq(stream)
  local last = redis.call('XREVRANGE', stream, '+', '-', 'COUNT', 1)[1]
  if not last then return -1 end
  local seq = tonumber(string.match(last[1], '^(%d+)'))
  if seq >= TIME_IDS_FROM then return nil end
  return seq
end

-- An event's seq, read from its JSON as the event models write it (type, then seq) without
-- decoding the rest (a delta's logprobs can be large).
local function event_seq(data)
  return tonumber(string.match(data, '^{"type":"[%a_]+","seq":(%d+)')) or cjson.decode(data)['seq']
end

-- Whether a stream whose last event is `last` lacks events sent before the event `data` (a failover's
-- new master had not received them): its writer must send those first.
local function is_behind(last, data)
  return last ~= nil and event_seq(data) > last + 1
end

-- Append an event to a job's stream unless the stream holds its seq already; `last` is the seq of
-- the stream's last event (`last_seq`), and the answer is that seq after the append.
local function append_event(stream, maxlen, last, kind, data)
  local id = '*'
  if last then
    local seq = event_seq(data)
    if seq <= last then return last end
    id, last = string.format('%d-1', seq), seq
  end
  local now = redis.call('TIME')
  local at = string.format('%d', now[1] * 1000 + math.floor(now[2] / 1000))
  redis.call('XADD', stream, 'MAXLEN', '~', maxlen, id, 'type', kind, 'data', data, 'at', at)
  return last
end
