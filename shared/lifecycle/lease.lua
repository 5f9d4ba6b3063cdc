-- Called by every script that reads who holds a job's lease (`Keys.lease`): the claim's
-- `claim:<worker>` until the start, then the running worker's id; and once a cancel of the running job
-- is asked for (`cancel.lua`), that id followed by '@' and when the cancel was asked, so that the
-- worker's step hears of it from the lease it reads anyway, rather than from a key more a job.
-- No worker id holds an '@' (`worker.heartbeat.new_worker_id`: host name, pid and ms).
local CANCEL_ASKED_AT = '@'

-- A lease's holder, and when a cancel was asked of the job (nil: none asked); false for no lease.
local function lease_holder(lease)
  if not lease then return false, nil end
  local at = string.find(lease, CANCEL_ASKED_AT, 1, true)
  if not at then return lease, nil end
  return string.sub(lease, 1, at - 1), string.sub(lease, at + 1)
end

-- Whether `holder` holds the lease, a cancel asked or not (an unasked lease, as nearly always, is
-- compared without being searched).
local function lease_held_by(lease, holder)
  return lease == holder or lease_holder(lease) == holder
end

-- The lease of `holder`, carrying the cancel asked at `asked_at` (false or nil: none asked).
local function lease_of(holder, asked_at)
  if not asked_at then return holder end
  return holder .. CANCEL_ASKED_AT .. asked_at
end
