-- uses: share_enqueue, tenant_move, append_event, expire_job, announce_end
-- running -> running (requeued for another worker to resume from its stream), or running -> failed
-- once the job has run `max_attempts` times. `worker` '' releases only a lapsed lease (a reaper);
-- a worker's id also releases its own (a worker handing its job back), and only the run `attempt`
-- names: that worker may have resumed the job meanwhile, a later run it must not hand back (0: any
-- run, for a reaper, which releases only a lapsed lease). arq's in-progress and retry
-- keys of the lost run go, so that arq runs the job again at once. A requeued job keeps its place:
-- its queue score is its submission time (the record's `created_at`), as at submit, so a rolling
-- restart does not send resumed jobs behind the backlog; its record and stream live `lifetime`
-- seconds from now, for the wait.
--
-- `queue` and `wakeup_channel` are those of the job's model (its record's `model`), and so are
-- `share_tenants`, `share_state` and `share_prefix`: a requeued job goes back into its share too,
-- and counts as its tenant's queued job, not a running one, until a worker resumes it.
--
-- Failing a job needs its output, which the caller computes from the stream: the first call of a
-- job out of attempts answers {'exhausted'} and drops the lease (so that nothing writes to the
-- stream any more; the job stays in the running set, for a reaper should the caller vanish). The
-- caller then reads the stream and calls again with `failure_event`, `text` and `token_count`
-- computed from it and `stream_tip`, the id of its last entry: the job fails only if the stream
-- still ends there.
-- Answers {'held'}, {'requeued'}, {'exhausted'}, {'failed'} or {'not_running', status or 'missing'}.
local record, stream, _, lease, running, queue, arq_job, arq_in_progress, arq_retry, webhooks, webhook,
      share_tenants, share_state = unpack(KEYS)
local id, worker, attempt, max_attempts, arq_payload, lifetime, now, retention, maxlen, message,
      wakeup_channel, failure_event, text, token_count, stream_tip, share_prefix = unpack(ARGV)

local holder = redis.call('GET', lease)
if holder and holder ~= worker then return {'held'} end
if attempt ~= '0' and redis.call('HGET', record, 'attempts') ~= attempt then return {'held'} end
local status = redis.call('HGET', record, 'status')
if status ~= 'running' then
  redis.call('SREM', running, id)
  return {'not_running', status or 'missing'}
end
if redis.call('HGET', record, 'requeued') then
  redis.call('SREM', running, id)
  return {'requeued'}
end
redis.call('DEL', lease, arq_in_progress, arq_retry)
if tonumber(redis.call('HGET', record, 'attempts') or '1') < tonumber(max_attempts) then
  redis.call('SREM', running, id)
  redis.call('HSET', record, 'requeued', '1')
  redis.call('SET', arq_job, arq_payload, 'EX', lifetime)
  redis.call('EXPIRE', record, lifetime)
  redis.call('EXPIRE', stream, lifetime)
  -- milliseconds, as submit scores it; '%d': Lua would print a large number in exponent form
  local score = string.format('%d', math.floor(tonumber(redis.call('HGET', record, 'created_at')) * 1000))
  redis.call('ZADD', queue, score, id)
  local share, priority = unpack(redis.call('HMGET', record, 'share', 'priority'))
  if share then
    share_enqueue(share_tenants, share_state, share_prefix .. share, share, priority, tonumber(score), id, lifetime)
  end
  tenant_move(id, 'running', 'queued', lifetime)
  redis.call('PUBLISH', wakeup_channel, id)
  return {'requeued'}
end
local last = redis.call('XREVRANGE', stream, '+', '-', 'COUNT', 1)[1]
if failure_event == '' or stream_tip ~= (last and last[1] or '') then return {'exhausted'} end
redis.call('SREM', running, id)
append_event(stream, maxlen, nil, 'error', failure_event)
redis.call('HSET', record, 'status', 'failed', 'finished_at', now, 'error', message, 'text', text,
           'token_count', token_count)
redis.call('ZREM', queue, id)
redis.call('DEL', arq_job)
expire_job(retention)
announce_end(webhooks, webhook, retention)
tenant_move(id, 'running', 'ended')
return {'failed'}
