-- uses: end_event, leave_queue, end_job
-- Ends a queued job that never ran: a cancel (cancel.lua), and a deadline that passed while it waited
-- (`expire_unrun.lua`). Its record ends in `state` at `job.now` with no output (and `error`, when there is
-- one), `event` of type `kind` ends its stream, and the job leaves its model's queue and its share
-- of it (`leave_queue.lua`), then ends (`end_job.lua`).
-- `job`: `end_job`'s table with `now` and `maxlen`; `model`: `leave_queue`'s.
local function end_unrun(job, model, state, error, kind, event)
  redis.call('HSET', job.record, 'status', state, 'finished_at', job.now, 'token_count', 0,
             'usage', '{"prompt_tokens":0,"completion_tokens":0}')
  if error then redis.call('HSET', job.record, 'error', error) end
  end_event(job, kind, event)
  leave_queue(job, model)
  end_job(job, 'queued')
end
