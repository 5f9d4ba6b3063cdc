-- uses: job_keys
-- completed | cancelled | failed -> (none): a finished job's keys go before their retention ends:
-- its record, stream and cancel key, and the idempotency key the record names. A job
-- still queued or running is left as it is (a worker may write to it yet; cancel it first).
-- KEYS: `JobKeys` of the job. Answers {'deleted', the state it had}, {'unfinished', its state} or
-- {'missing'}.
local job = job_keys({})
local record, stream, cancel = job.record, job.stream, job.cancel

local status, idempotency = unpack(redis.call('HMGET', record, 'status', 'idempotency_key'))
if not status then return {'missing'} end
if status == 'queued' or status == 'running' then return {'unfinished', status} end
redis.call('DEL', record, cancel)
if stream ~= '' then redis.call('DEL', stream) end
if idempotency then redis.call('DEL', idempotency) end
return {'deleted', status}
