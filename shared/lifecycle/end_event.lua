-- uses: append_event
-- A job's terminal event, in the script that ends the record: appended to the job's stream, or with
-- the stream on a Redis of its own (`job.stream` '') kept in the record as `end_event` (its JSON,
-- with its type before it and a space between), for the stream's end that follows the record's
-- (`stream_end.lua`) and, should its caller stop before that (or a failover of the streams' Redis
-- lose a worker's end, which reaches the stream first), for a reader that finds the record ended
-- and the stream not (the gateway's relay) to end the stream with.
-- `job`: {record, stream, maxlen}.
local function end_event(job, kind, event)
  if job.stream == '' then
    redis.call('HSET', job.record, 'end_event', kind .. ' ' .. event)
  else
    append_event(job.stream, job.maxlen, nil, kind, event)
  end
end
