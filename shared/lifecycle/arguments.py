"""What each lifecycle script takes: one named table, field for field as the script reads it.

A table travels as the script's one ARGV, JSON (`scripts.encode`), and the script reads it with
`local args = cjson.decode(ARGV[1])`. A number the script writes into Redis as it came (a time in
seconds, a share's stride) travels as text: Redis 7.0 writes a Lua number with 17 significant
digits, so 0.1 would become 0.10000000000000001. A field that is None goes as no field at all (nil).

The step alone keeps positional ARGV, named by `StepArgs` and `StepJobArgs` on this side and by the
same names in `step.lua`: it carries every running job's events at every engine step, and decoding a
table of them costs Redis more than appending them.
"""

from __future__ import annotations

from typing import NamedTuple, TypedDict


class TenantArgs(TypedDict):
    name: str
    limits: dict[str, int]  # by `shared.tenants.LIMITS` name; 0 is none (`tenant_admit.lua`)


class ShareArgs(TypedDict):
    name: str  # the tenant whose share of the model's queue the job waits in
    prefix: str  # the model's `share_queue_prefix`
    stride: str  # one over the tenant's weight
    priority: int


class SubmitArgs(TypedDict):
    id: str
    created_at: str  # seconds since the epoch; the queue's score is it in ms (`share_member.lua`)
    request: str  # the request's JSON
    digest: str  # the request's, kept beside the idempotency key ('' without one)
    queued_event: str
    owner: str
    model: str
    lifetime: int
    max_queued: int  # the model's queue's depth that refuses the job; 0 is none
    maxlen: int
    wakeup: str  # the model's wake-up channel
    tenant: TenantArgs | None  # None: a job of no tenant
    share: ShareArgs
    job_prefix: str  # a job record's key without its id
    fields: dict[str, str]  # what the record keeps beside the job, for the API layer that made it
    index_size: int  # how many newest jobs the job index keeps (its key is '' with none)
    deadline: str | None  # unix seconds: still queued then, the job fails unrun; None: no deadline
    blocks: list[str]  # the prompt's leading block hashes (`shared.scheduling`); [] for none
    preferred: PreferredArgs  # where a job whose prefix a live worker holds is listed for it


class PreferredArgs(TypedDict):
    prefix: str  # the model's `preferred_prefix`: + worker + ':' + share, the worker's list of a share's jobs
    scale: int  # a job's score there: priority * scale - the blocks held (fewer than scale)


class StartArgs(TypedDict):
    id: str
    worker: str
    now: str
    running_event: str
    expired_event: str  # the `error` event of a job whose deadline passed while it waited
    expired_message: str
    maxlen: int
    lease_ms: int
    retention: int
    lifetime: int
    share_prefix: str
    notices: str  # `Keys.notices_of` the job


class ExpireArgs(TypedDict):
    id: str
    now: str
    expired_event: str  # the `error` event that ends its stream, code `deadline_exceeded`
    expired_message: str
    maxlen: int
    retention: int
    share_prefix: str
    notices: str  # `Keys.notices_of` the job


class StepArgs(NamedTuple):
    """The step's first ARGV, in `step.lua`'s order; its notices follow them, then each job's part
    (`StepJobArgs`)."""

    worker: str
    maxlen: int
    sent_at: int  # ms, by the worker's clock
    publish: str  # PUBLISH, or SPUBLISH for a partition's shard channel on a Redis Cluster
    notices: int
    """How many (channel, message) pairs follow, one a notice partition the call appends to:
    `Keys.notice_channel`, and the partition's entries, `shared.notices.notice_line` each, a line apart."""


class StepJobArgs(NamedTuple):
    """One job's part of the step's ARGV, in `step.lua`'s order; its (id, type, data) per event follow."""

    check: str  # '' for a step whose stream cannot have lost anything: it is not read
    trim: str  # '' when every event's seq is below the stream's cap: the stream is not trimmed
    events: int


class FinishArgs(TypedDict):
    id: str
    worker: str
    state: str
    maxlen: int
    retention: int
    events: list[tuple[str, str]]  # (type, data), the terminal one last
    fields: dict[str, str]  # the record's, with its end
    notices: str  # `Keys.notices_of` the job


class CancelArgs(TypedDict):
    id: str
    now: str
    cancelled_event: str
    maxlen: int
    retention: int
    lifetime: int
    share_prefix: str
    stream_tip: str  # '' on a first call; then the id of the stream's last entry ('0-0' for none)
    fields: dict[str, str]  # the record's, computed from the stream up to `stream_tip`
    notices: str  # `Keys.notices_of` the job


class FailureArgs(TypedDict):
    event: str
    fields: dict[str, str]  # the record's, from the output the stream holds
    stream_tip: str


class ReleaseArgs(TypedDict):
    id: str
    worker: str  # '' for a reaper: only a lapsed lease is released
    attempt: int  # 0: any run
    max_attempts: int
    lifetime: int
    now: str
    retention: int
    maxlen: int
    message: str
    wakeup: str
    share_prefix: str
    failure: FailureArgs | None  # None on a first call
    notices: str  # `Keys.notices_of` the job


class RenewArgs(TypedDict):
    worker: str
    lease_ms: int
    lifetime: int
    extend: list[int]  # positions (from 1) of the jobs whose record and stream get `lifetime` again


class ClaimArgs(TypedDict):
    worker: str
    lease_ms: int  # how long a claim holds the job for its start
    lease_prefix: str  # a lease's key is prefix + job id + suffix (`Keys.lease_affixes`)
    lease_suffix: str
    share_prefix: str
    job_prefix: str  # a record's key is prefix + job id (`Keys.job`)
    read_limit: int
    wanted: int
    batch_wanted: int  # the most jobs of the batch band to take (`shared.batches`)
    charges: list[tuple[str, int]]  # (job id, output tokens) of the jobs ended since the worker's last claim
    affinity: AffinityArgs | None  # None: each tenant's first job, wherever its prefix is cached


class AffinityArgs(TypedDict):
    preferred_prefix: str  # as `PreferredArgs`
    scale: int
    running: int  # the jobs the claiming worker runs now
    window: int  # how many of a share's head jobs a claim looks at
    wait_ms: int  # how long a job is left to the worker holding its prefix, or to a less loaded one
    stale_ms: int  # a worker's load older than this is not counted (it claims nothing: it is full)
    blocks_ttl_ms: int  # how long the worker's advertised blocks live on from this claim


class AdvertiseArgs(TypedDict):
    worker: str
    blocks: list[str]  # a prompt's leading block hashes, in order
    capacity: int  # how many blocks the worker's cache holds (0: not known, no bound)
    ttl_ms: int  # how long its blocks count without a claim of the worker's
    index_ttl_ms: int  # how long the model's map lives without an advertisement


class UnclaimArgs(TypedDict):
    worker: str
    wakeup: str  # the model's wake-up channel


class TenantUsageArgs(TypedDict):
    tenant: str
    job_prefix: str


class BatchCreateArgs(TypedDict):
    id: str  # the batch's
    fields: dict[str, str]  # its record
    score: int  # its creation (ms), its place among its owner's and the active batches
    max_of_key: int  # most batches its API key runs at once; 0: no bound
    max_of_tenant: int  # as many for its tenant


class BatchMoveArgs(TypedDict):
    id: str  # the batch's
    allowed: list[str]  # the states it may move from
    to: str
    fields: dict[str, str]  # written into the record with the move
    ends: bool  # `to` is an end: the batch leaves the active ones, its webhook hears of it
    retention: int  # seconds an ended batch's record stays readable


class Notices(TypedDict):
    """Where a data-plane script publishes its notice (`shared.notices`), and with which command."""

    publish: str  # as `StepArgs.publish`
    notices: str  # `Keys.notices_of` the job


class StreamOpenArgs(TypedDict):
    queued_event: str
    maxlen: int
    lifetime: int


class StreamTakeArgs(Notices):
    worker: str
    asked_at: str | None  # when a cancel of the job was asked for, None for none
    running_event: str | None  # a first run's `running` event; None for a resumed job
    lifetime: int
    maxlen: int


class StreamEndArgs(Notices):
    holder: str | None  # the worker ending its job; None for an end made without one
    asked_at: str  # with no holder: the cancel a writer found meanwhile carries (`stream_end.lua`)
    events: list[tuple[str, str]]  # (type, data), the terminal one last
    maxlen: int | None  # None: the stream is not trimmed
    retention: int


class WriterMarkArgs(TypedDict):
    asked_at: str


class WriterDropArgs(TypedDict):
    holder: str
    lifetime: int | None  # the stream's new TTL, None to leave it


class CursorCheckArgs(TypedDict):
    cursor: str  # a reader's cursor as '<ms>-<seq>', in decimals without leading zeros
    count: int  # most entries after it to read; 0 for none
