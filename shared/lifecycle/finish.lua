-- uses: append_event, expire_job, announce_end, tenant_move
-- running -> completed | cancelled | failed: append the last events (the terminal one last) and
-- end the record, if this worker still holds the lease. A job that is no longer running is left as
-- it is, and so is one whose lease this worker no longer holds: nothing is appended. So is one whose
-- stream lacks events before these (a failover's new master had not received the job's last steps:
-- `step.lua`). Events the stream holds already (this end sent again) are not appended twice.
-- ARGV after the first six: `event_count` (type, data) pairs, then field/value pairs for the record.
-- Answers {'ended', state}, {'not_running', status or 'missing'}, {'lost'} or {'behind', last seq}.
local record, stream, _, lease, running, webhooks, webhook = unpack(KEYS)
local id, worker, state, maxlen, retention, event_count = unpack(ARGV, 1, 6)
local FIRST_EVENT = 7
local first_field = FIRST_EVENT + 2 * tonumber(event_count)

local status = redis.call('HGET', record, 'status')
if status ~= 'running' then return {'not_running', status or 'missing'} end
if redis.call('GET', lease) ~= worker then return {'lost'} end
local last = last_seq(stream)
if first_field > FIRST_EVENT and is_behind(last, ARGV[FIRST_EVENT + 1]) then return {'behind', last} end
for i = FIRST_EVENT, first_field - 1, 2 do last = append_event(stream, maxlen, last, ARGV[i], ARGV[i + 1]) end
redis.call('HSET', record, 'status', state, unpack(ARGV, first_field))
redis.call('DEL', lease)
redis.call('SREM', running, id)
expire_job(retention)
announce_end(webhooks, webhook, retention)
tenant_move(id, 'running', 'ended')
return {'ended', state}
