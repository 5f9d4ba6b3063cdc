-- uses: append_event
-- Data plane (a Redis of its own for the streams: `Transitions`), before the submit: a new job's
-- stream, with its `queued` event, living the job lifetime. Written before the record, so that a
-- record (what a 202 answers for) never exists without its stream; a submit that then writes no
-- record (refused, or the idempotency key's job) has the caller delete the stream again, and one
-- cut short by a crash leaves a stream nobody names, which expires. Takes `arguments.StreamOpenArgs`.
-- KEYS: the job's stream. Answers 1 when it made the stream, 0 when the stream existed (the job's
-- own, submitted again: nothing written).
local stream = KEYS[1]
local args = cjson.decode(ARGV[1])
if redis.call('EXISTS', stream) == 1 then return 0 end
append_event(stream, args.maxlen, nil, 'status', args.queued_event)
redis.call('EXPIRE', stream, args.lifetime)
return 1
