"""The job state machine: one Lua script per transition (`*.lua` here), each run atomically inside
Redis and called through one typed wrapper (`transitions.py`).

States only move forward, and each transition writes the record and the job's status or
terminal event together, so a reader never sees one without the other::

    script    from                    to                        who calls it
    --------  ----------------------  ------------------------  ------------------------------
    submit    (none)                  queued                    gateway (JobStore.submit)
    claim     queued                  queued, claimed (leased)  worker's queue loop
    unclaim   queued, claimed         queued                    worker's queue loop (not starting it)
    start     queued                  running (attempt 1)       worker (JobStore.start)
              queued, past deadline   failed
              running, requeued       running (attempt n + 1)   the resume path
    step      running                 running (events added)    worker's publisher
    renew     running                 running (lease extended)  worker's heartbeat
    release   running                 running, requeued         worker handing back / a reaper
              running, out of tries   failed (worker_lost)
    finish    running                 completed | cancelled |   worker's publisher
                                      failed
    expire    queued, past deadline   failed                    gateways' deadline sweep
                                                                (JobStore.expire_due)
    cancel    queued                  cancelled                 gateway (JobStore.cancel)
              running, held by none   cancelled                 (handed back, or its lease lapsed)
              running                 running, cancel asked     (its lease carries it: its next
                                                                step ends it cancelled)
    delete    completed | cancelled   (none: its keys go)       gateway (JobStore.delete)
              | failed

Each script takes its KEYS (declared, as Redis Cluster would route by them) and one named table.
Every script that touches a job takes that job's keys and its model's first, in one order
(`shared.keys.JobKeys`), and reads them through one helper (`job_keys.lua`), which also makes the
`job` and `model` tables the helpers below take; the script's own keys follow. The named table is
its only ARGV, JSON, which it reads with `cjson.decode(ARGV[1])`, typed on this side by a TypedDict
of `arguments.py` with the same field names. The step alone keeps positional ARGV, named by
`arguments.StepArgs` and by the same names in `step.lua`: it runs once per running job per engine
step, and decoding a table there would cost Redis about 15 % more per step.

The rest of the `.lua` files are helpers: a script names those it calls on its first line
(`-- uses: end_job, enqueue`), and the loader (`scripts.py`) prepends them, and the helpers they
name in turn, each once and before its callers. A helper takes what it works on as arguments
(a `job` table of its keys and values), never its caller's KEYS:

    helper            what it does                                            used by
    ----------------  ------------------------------------------------------  ----------------------
    job_keys          a job's keys (`JobKeys`) as the `job` and `model`       submit, start, finish,
                      tables                                                  release, cancel,
                                                                              expire, delete
    end_job           every end: the job's keys expire after the retention,  finish, release,
                      its webhook hears of it (announce_end), it leaves its  cancel, end_unrun
                      tenant's counters with its usage (tenant_move), its
                      batch counts it (batch_end)
    end_unrun         a queued job ends without running (a cancel, a         cancel, expire_unrun
                      deadline): empty output, out of the queue, end_job
    expire_unrun      a queued job past its deadline fails unrun, counted    start, expire
                      per model (`Keys.jobs_expired`)
    enqueue           a job on its model's queue (arq's queue set), its      submit, release
                      tenant's share of it (fair: `claim.lua`), a wake-up
    leave_queue       out of the queue, its share and the deadlines          start, cancel, end_unrun
    share_member      a job's queue score and share member (one format;      enqueue, leave_queue,
                      `shared.keys.share_member` reads it), a share's band   claim
    append_event      a stream's events under ids made of their seqs         submit, start, step,
                                                                             release, finish, cancel
    lease             a lease's holder, and the cancel asked of its running  start, step, renew,
                      job that it carries after it                           release, finish, cancel,
                                                                             unclaim
    tenant_admit      a tenant's limits against its counters                 submit, tenant_usage
    tenant_move       a job between its tenant's counters (`shared.tenants`)  start, release, end_job
    announce_end      a job's end on the webhooks stream                     end_job
    batch_end         a batch's job's end in its batch's request counts      end_job
    hset_fields       a table of record fields into the record               submit, finish, cancel
    clock_ms          Redis's clock in ms (the one reading of TIME)          append_event, tenant_*

Every record, stream and share these scripts read was written by them as they are: a stream's
ids are its events' seqs, and every queued job has a share.

Two planes. By default one Redis holds everything, and each transition is the one script above. With
`streams_redis_url` set, the job streams (the data plane: what each step writes and readers follow)
live on a Redis of their own, and everything else (the control plane: records, queues and shares,
leases, tenants, idempotency keys, webhooks, registries) stays on `redis_url`. A script may only
touch keys of its own Redis, so each transition that writes a stream runs in two parts there: its
script above on the control plane with the stream's key given as '' (it leaves the stream alone,
and an end no worker makes keeps its terminal event in the record instead: `end_event`), and a
script of the data plane's own. Which of the two a deployment has is chosen once, at start
(`planes.py`: `OneRedis` or `StreamsApart`), and `Transitions` calls the seam at each point where a
transition's data-plane part goes, never asking which one it has. On the data plane a job's lease is
mirrored by its *writer* (`Keys.writer`): the worker whose steps the stream takes, carrying a
cancel asked as the lease does; the step reads it instead of the lease::

    transition  control plane        data plane              order, and what a stop between leaves
    ----------  -------------------  ----------------------  ----------------------------------------
    submit      submit               stream_open             stream first: a record never lacks its
                                                             stream; a refused submit deletes it, a
                                                             stop leaves a stream nobody names, which
                                                             expires
    start       start                stream_take (writer,    record first: the writer after the lease,
                                     running event, read)    the stream read after the writer; a stop
                                                             leaves a lease that lapses (the reaper
                                                             hands the job on). A stream that already
                                                             ends has the worker end the record as it
                                                             says instead
    step        -                    step                    data plane alone
    finish      finish               stream_end (holder)     stream first, while the worker holds the
                                                             writer; a stop leaves a running record
                                                             whose lease lapses, and the next start
                                                             finds the stream ended (above)
    cancel      cancel               writer_mark first (a    the writer's ask first; then the record,
                                     running job's ask),     and a stop leaves an ended record whose
                                     then stream_end, or     stream has not ended: until it does the
                                     writer_drop (unheld)    job reads as running, and a
    release     release              writer_drop, or         reader ends it `gateway.relay.relay.HEAL_SECONDS`
                                     stream_end (failed)     later with the record's `end_event`
    expire      expire               stream_end              as a cancel of a queued job
    renew       renew                EXPIRE of stream and    either; the writer lives a job lifetime
                                     writer                  and goes at the job's end
    delete      delete               DEL of stream, writer   record first; a stop leaves a stream that
                                                             expires after the retention
    (read)      HMGET of the record  cursor_check            record first: a job ended on the control
                                                             plane but not yet on the data plane reads
                                                             as running

A worker that lost a job writes nothing: every hand that takes a job from a worker (a release, a
reaper, a cancel of a job no worker holds) drops that worker's writer before anything else appends;
a start sets the new worker's writer before it reads where the stream stands. Only the Redis of the
data plane runs the steps, so it carries the load that grows with tokens; the control plane's grows
with jobs started and ended.
"""
