-- uses: append_event, lease
-- Data plane, after a start: the job's writer becomes the starting worker (carrying a cancel asked
-- meanwhile: `lease.lua`), so that from now on only its steps append to the stream; then the stream
-- is read, so that a resumed job continues after every event an earlier worker appended, its last
-- steps included. The writer and the stream live `lifetime` seconds from now. A first run appends its
-- `running` event.
-- A stream that already ends (an earlier worker's end reached the stream and not the record: it
-- stopped between the two) is not written: the worker ends the record as the stream says.
-- Takes `arguments.StreamTakeArgs`. KEYS: the job's stream and writer.
-- Answers {'running'}, {'resumed', entries}, {'ended', entries} or {'missing'} (no stream: lost in a
-- failover before a replica had it, or expired with the job's keys; nothing is written).
local stream, writer = unpack(KEYS)
local args = cjson.decode(ARGV[1])

local last = redis.call('XREVRANGE', stream, '+', '-', 'COUNT', 1)[1]
if not last then
  if redis.call('EXISTS', stream) == 0 then return {'missing'} end
end
if last and is_terminal(last) then return {'ended', redis.call('XRANGE', stream, '-', '+')} end
redis.call('SET', writer, lease_of(args.worker, args.asked_at), 'EX', args.lifetime)
redis.call('EXPIRE', stream, args.lifetime)
if args.running_event then
  append_event(stream, args.maxlen, nil, 'status', args.running_event)
  redis.call(args.publish, args.notices, stream)
  return {'running'}
end
return {'resumed', redis.call('XRANGE', stream, '-', '+')}
