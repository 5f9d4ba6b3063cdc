-- The keys of a job and of its model, first in every script that touches a job, in the order of
-- `shared.keys.JobKeys`; a script's own keys follow them, from KEYS[JOB_KEYS + 1]. Answers the `job`
-- table the helpers take (`end_job.lua`, `end_unrun.lua`), made of those keys and of the script's
-- named table `args` (its id, retention, maxlen, now and notices, where it has them), and the `model`
-- table (`leave_queue.lua`, `expire_unrun.lua`, `enqueue.lua`), with `args`'s share_prefix and wakeup.
local JOB_KEYS = 13

local function job_keys(args)
  local record, stream, cancel, lease, running, webhooks, webhook, queue, deadlines, share_tenants, share_state,
        batch_share_tenants, expired = unpack(KEYS, 1, JOB_KEYS)
  local job = {id = args.id, record = record, stream = stream, cancel = cancel, lease = lease, running = running,
               webhooks = webhooks, webhook = webhook, retention = args.retention, maxlen = args.maxlen,
               now = args.now, notices = args.notices}
  local model = {queue = queue, deadlines = deadlines, share_tenants = share_tenants, share_state = share_state,
                 batch_share_tenants = batch_share_tenants, expired = expired, share_prefix = args.share_prefix,
                 wakeup = args.wakeup}
  return job, model
end
