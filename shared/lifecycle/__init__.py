"""The job state machine: one Lua script per transition (`*.lua` here), each run atomically inside
Redis and called through one typed wrapper (`transitions.py`).

States only move forward, and each transition writes the record and the job's status or
terminal event together, so a reader never sees one without the other::

    script    from                    to                        who calls it
    --------  ----------------------  ------------------------  ------------------------------
    submit    (none)                  queued                    gateway (JobStore.submit)
    claim     queued                  queued, marked taken      worker's queue loop (arq's mark)
    start     queued                  running (attempt 1)       worker (JobStore.start)
              queued, past deadline   failed
              running, requeued       running (attempt n + 1)   the resume path
    step      running                 running (events added)    worker's publisher
    renew     running                 running (lease extended)  worker's heartbeat
    release   running                 running, requeued         worker handing back / a reaper
              running, out of tries   failed (worker_lost)
    finish    running                 completed | cancelled |   worker's publisher
                                      failed
    cancel    queued                  cancelled                 gateway (JobStore.cancel)
              running, held by none   cancelled                 (handed back, or its lease lapsed)
              running                 running, cancel asked     (its next step ends it cancelled)
    delete    completed | cancelled   (none: its keys go)       gateway (JobStore.delete)
              | failed

`expire_job.lua` and `announce_end.lua` are helpers the loader prepends to the scripts that end a
job: every end lets the job's keys expire, and announces the end of a job with a webhook (an entry
on the webhooks stream that the gateways' senders deliver, and the job's delivery record).
`tenant_admit.lua` checks a job's tenant's limits in submit; `tenant_move.lua` moves the job between
its tenant's counters in the scripts that start, hand back or end it (`shared.tenants`);
`tenant_usage.lua` reads the counters as submit counts them. `share_enqueue.lua`
puts a job in its tenant's share of its model's queue in the scripts that queue it (submit, and
release's requeue), and `share_leave.lua` takes it out in those that end its wait (start, cancel);
claim picks among the shares fairly (start-time fair queuing, by weight).
"""
