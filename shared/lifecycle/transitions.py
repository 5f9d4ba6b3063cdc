"""One typed wrapper per lifecycle script: named parameters in, an enum (or a small result) out."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

import redis.asyncio as aioredis

from shared.batches import batch_share
from shared.events import ErrorEvent, Event, JobState, StatusEvent, event_json
from shared.keys import Keys, ModelKeys
from shared.lifecycle import scripts
from shared.lifecycle.arguments import (
    AdvertiseArgs,
    CancelArgs,
    ClaimArgs,
    ExpireArgs,
    FailureArgs,
    FinishArgs,
    Notices,
    ReleaseArgs,
    RenewArgs,
    StartArgs,
    StepArgs,
    StepJobArgs,
    StreamEndArgs,
    StreamOpenArgs,
    StreamTakeArgs,
    SubmitArgs,
    TenantArgs,
    TenantUsageArgs,
    UnclaimArgs,
    WriterMarkArgs,
)
from shared.notices import LINE, notice_line
from shared.redis_client import StreamsRedis
from shared.replication import Wait
from shared.scheduling import MAX_PREFIX_BLOCKS
from shared.tenants import DEFAULT_SHARE, Tenant, TenantUsage


class SubmitOutcome(Enum):
    created = "created"
    existing = "existing"  # the job an earlier request with the same idempotency key made
    mismatch = "mismatch"  # the key's job was made for another request: nothing was written
    overloaded = "overloaded"  # the queue is full: nothing was written
    rate_limited = "rate_limited"  # the job's tenant is at one of its limits: nothing was written


@dataclass(frozen=True)
class TenantRefusal:
    """The tenant's limit a job met: its name (`shared.tenants.LIMITS`), the count it met and its value,
    and the seconds after which a retry may be admitted."""

    limit: str
    retry_after: int
    count: int
    value: int


@dataclass(frozen=True)
class Submitted:
    outcome: SubmitOutcome
    job_id: str  # the new job's, or the key's existing one; '' when refused
    queue_depth: int = 0
    acked: int | None = None  # replicas holding the writes, when a WAIT followed them
    refusal: TenantRefusal | None = None  # with `rate_limited`


class StartOutcome(Enum):
    running = "running"  # queued -> running, attempt 1
    resumed = "resumed"  # a handed-back job runs again, with the next attempt
    expired = "expired"  # its deadline passed while queued: failed without running
    refused = "refused"  # nothing to run: cancelled, ended, missing or held by another worker
    ended = "ended"  # its stream ends already, its record not: an earlier run stopped between the two


@dataclass(frozen=True)
class StartAnswer:
    outcome: StartOutcome
    request: str = ""  # the request's JSON
    created_at: float = 0.0
    attempt: int = 0
    entries: list[dict[str, str]] = field(default_factory=list)  # a resumed or ended job's stream
    conversation: str = ""  # the record's `conversation` field: '' for a job that is no turn of one


class ExpireOutcome(Enum):
    expired = "expired"  # queued, past its deadline -> failed
    passed = "passed"  # nothing to end: no longer queued (or gone), or its deadline has not come


class Verdict(Enum):
    """What a job learns from its step."""

    go = "go"
    cancel = "cancel"  # a cancel was asked for: abort and end with `cancelled`
    lost = "lost"  # another worker holds the job now (or will), or its keys expired: stop without writing
    behind = "behind"  # the stream lacks the job's last events (a failover lost them): nothing written


@dataclass(slots=True)
class JobStep:
    """One job's engine step: its new events. `check`: the stream is read first, for a step that may
    have reached it already (sent again) or may follow events a failover lost (the first of its job
    since a round trip failed).

    Not frozen, though never changed: one is made per job and step, and a frozen one takes three
    times as long to make."""

    job_id: str
    events: list[Event]
    check: bool = False


@dataclass(frozen=True)
class StepAnswer:
    verdict: Verdict
    cancel_asked_at: float | None = None  # with `cancel`: when it was asked for (epoch seconds)
    last_seq: int = -1  # with `behind`: the seq of the last event the stream holds

    @classmethod
    def of(cls, answer: Any) -> StepAnswer:
        """The step script's answer: 'go', 'lost', ['behind', last seq] or ['cancel', when it was
        asked for]."""
        if not isinstance(answer, list):
            return cls(Verdict(answer))
        if answer[0] == Verdict.behind.value:
            return cls(Verdict.behind, last_seq=int(answer[1]))
        asked_at = None
        with contextlib.suppress(ValueError):  # a value that is no time only goes unmeasured
            asked_at = float(answer[1])
        return cls(Verdict.cancel, asked_at)


class FinishOutcome(Enum):
    ended = "ended"  # the job ended here, in the state asked for
    not_running = "not_running"  # it had ended already (or never ran): left as it was
    lost = "lost"  # another worker holds the job now: nothing written
    behind = "behind"  # the stream lacks the job's last events (a failover lost them): nothing written


@dataclass(frozen=True)
class Finished:
    outcome: FinishOutcome
    state: JobState | None = None  # the record's state after the call; None: no such job
    last_seq: int = -1  # with `behind`: the seq of the last event the stream holds

    @classmethod
    def of(cls, answer: list[str]) -> Finished:
        outcome, *rest = answer
        if outcome == FinishOutcome.behind.value:
            return cls(FinishOutcome.behind, last_seq=int(rest[0]))
        return cls(FinishOutcome(outcome), JobState(rest[0]) if rest and rest[0] != "missing" else None)


PUBLISH = "PUBLISH"
PREFERRED_SCALE = 2 * MAX_PREFIX_BLOCKS  # past the blocks a job's prefix can hold (`PreferredArgs`)
PREFIX_INDEX_TTL_MS = (
    24 * 3600 * 1000
)  # a model's prefix map outlives a day without a new prompt run, no more
SHARD_PUBLISH = "SPUBLISH"  # on a Redis Cluster: to the subscribers of the master of the channel's slot


@dataclass(frozen=True)
class StepCall:
    """One step script call of a round trip: `positions`, the steps it carries (their places in the
    round trip's), None for all of them in their order."""

    positions: list[int] | None
    command: tuple[Any, ...]


@dataclass(frozen=True)
class FinishCommands:
    """A job's end as pipeline commands: with the streams apart, `stream` on their Redis first (the
    worker's last events, while it holds the writer), then `record`, only once `stream` ended it."""

    stream: tuple[Any, ...] | None
    record: tuple[Any, ...]


class CancelOutcome(Enum):
    cancelled = "cancelled"  # queued (or running, held by no worker) -> cancelled
    asked = "asked"  # running: its worker ends it cancelled at its next step
    unheld = "unheld"  # running, held by no worker: ending it needs its output from the stream
    ended = "ended"  # already in a terminal state: nothing changed
    missing = "missing"


@dataclass(frozen=True)
class CancelResult:
    outcome: CancelOutcome
    state: JobState | None = None  # the state the job is in now; None: no such job
    acked: int | None = None  # replicas holding the writes, when a WAIT followed them


class DeleteOutcome(Enum):
    deleted = "deleted"  # a finished job's keys are gone
    unfinished = "unfinished"  # queued or running: left as it is
    missing = "missing"


@dataclass(frozen=True)
class DeleteResult:
    outcome: DeleteOutcome
    state: JobState | None = None  # the state the job had; None: no such job
    acked: int | None = None  # replicas holding the deletion, when a WAIT followed it


class ReleaseOutcome(Enum):
    held = "held"  # another worker (or another run of the job) holds the lease: left alone
    requeued = "requeued"  # back in the queue, for another worker to resume
    exhausted = "exhausted"  # out of attempts; failing it needs its output from the stream
    failed = "failed"  # out of attempts: failed with `worker_lost`
    not_running = "not_running"  # ended (or missing) already: left alone


@dataclass(frozen=True)
class Failure:
    """How a job out of attempts fails: its last event and the output its stream holds."""

    event: ErrorEvent
    text: str
    token_count: int
    stream_tip: str  # the id of the stream's last entry these were computed from ('' when empty)

    def args(self) -> FailureArgs:
        """The failure as the release script reads it."""
        return {
            "event": event_json(self.event),
            "text": self.text,
            "token_count": self.token_count,
            "stream_tip": self.stream_tip,
        }


@dataclass(frozen=True)
class NewJob:
    """A job to submit. `model`: the canonical name of the job's model, whose queue it joins;
    `annotations`: fields the record keeps beside the job, for the API layer that made it; `tenant`:
    whose limits the job must fit, whose counters it joins and whose share of the queue it waits in
    (None: no tenant's; it waits in the default tenant's share); `priority`: its order within that
    share, lower first; `batch`: the batch the job is a line of, whose band it waits in (that
    tenant's share of the batch band: `shared.batches`) and whose record counts its end."""

    job_id: str
    created_at: float
    request_json: str
    request_digest: str  # '' without an idempotency key
    queued: StatusEvent
    idempotency_key: str | None
    owner: str
    model: str
    lifetime_seconds: int
    max_queued: int
    maxlen: int
    annotations: dict[str, str] = field(default_factory=dict)
    tenant: Tenant | None = None
    priority: int = 0
    batch: str | None = None
    index_size: int = 0  # how many newest jobs the job index keeps; 0: the job is not indexed
    deadline: float | None = None  # unix seconds: still queued then, the job fails unrun
    # Its prompt's tokens, counted against its tenant's share of the queue (None: the share counts
    # jobs); its prompt's leading block hashes (`shared.prefix_blocks`), which find the worker whose
    # cache holds them.
    prompt_tokens: int | None = None
    prefix_blocks: tuple[str, ...] = ()


def _fields(entries: list[Any]) -> list[dict[str, str]]:
    """Stream entries as XRANGE answers them inside a script, each entry's fields as a dict."""
    return [dict(zip(pairs[::2], pairs[1::2], strict=True)) for _, pairs in entries]


class Transitions:
    """The job lifecycle's scripts, each behind one method.

    `streams`: the Redis of the job streams, when they have one of their own (`streams_redis_url`).
    Each transition that writes a stream then runs in two parts, its script on `redis` with the
    stream's key left '' and its part on `streams` (`stream_*.lua`, `writer_*.lua`), in the order
    that keeps the job whole should the caller stop between them (`shared.lifecycle`).
    """

    def __init__(self, redis: aioredis.Redis, keys: Keys, streams: StreamsRedis | None = None) -> None:
        self.redis = redis
        self.keys = keys
        self.streams = redis if streams is None else streams
        self.split = streams is not None
        self.between_planes: Callable[[str], None] | None = None
        """A fault hook, for tests: called with the transition's name between its write on one Redis
        and its write on the other, where a test stops the caller (raises) as a crash would."""

    def between(self, transition: str) -> None:
        """The point between a transition's two writes (`between_planes`)."""
        if self.between_planes is not None:
            self.between_planes(transition)

    def _job_keys(self, job_id: str) -> list[str]:
        """The record, stream and cancel key, as the scripts on `redis` take them: the stream '' when
        it lives apart."""
        stream = "" if self.split else self.keys.stream(job_id)
        return [self.keys.job(job_id), stream, self.keys.cancel(job_id)]

    async def end_stream(
        self,
        job_id: str,
        events: list[tuple[str, str]],
        *,
        maxlen: int | None,
        retention_seconds: int,
        now: float,
    ) -> str:
        """With the streams apart, the end of a job no worker ends (a cancel, a deadline, a job out of
        attempts), after its record's, with its terminal event, (type, data): `stream_end.lua`'s
        answer. `maxlen` None: the stream is not trimmed."""
        args: StreamEndArgs = {
            "holder": None,
            "asked_at": repr(now),
            "events": events,
            "maxlen": maxlen,
            "retention": retention_seconds,
            **self._notices_of(job_id),
        }
        keys = [self.keys.stream(job_id), self.keys.writer(job_id)]
        answer: list[Any] = await scripts.STREAM_END(self.streams, keys, args)
        return str(answer[0])

    def _notices_of(self, job_id: str) -> Notices:
        """Where a data-plane script tells of its appends to the job's stream, and how."""
        publish = SHARD_PUBLISH if self.keys.partitions else PUBLISH
        return {"publish": publish, "notices": self.keys.notices_of(job_id)}

    async def drop_writer(self, job_id: str, holder: str, lifetime_seconds: int | None = None) -> None:
        """With the streams apart, once the job is taken from `holder`: its writer goes."""
        keys = [self.keys.writer(job_id), self.keys.stream(job_id)]
        await scripts.WRITER_DROP(self.streams, keys, {"holder": holder, "lifetime": lifetime_seconds})

    def _announce_keys(self, job_id: str) -> list[str]:
        """The last keys of every script that may end a job: where its end is announced to its webhook."""
        return [self.keys.webhooks, self.keys.webhook(job_id)]

    def _tenant_keys(self, tenant: Tenant | None) -> list[str]:
        """The submit script's last keys: the tenant's counters, '' each for a job of no tenant."""
        if tenant is None:
            return ["", "", "", ""]
        name, keys = tenant.name, self.keys
        return [
            keys.tenant_queued(name),
            keys.tenant_running(name),
            keys.tenant_requests(name),
            keys.tenant_tokens(name),
        ]

    async def _run(
        self, script: scripts.LuaScript[scripts.Args], keys: list[str], args: scripts.Args, wait: Wait | None
    ) -> tuple[Any, int | None]:
        """The script's answer, and with `wait` how many replicas hold its writes (same round trip)."""
        if wait is None:
            return await script(self.redis, keys, args), None
        return await script.then_wait(self.redis, keys, args, wait.commands)

    async def submit(self, job: NewJob, wait: Wait | None = None) -> Submitted:
        """Write the job queued, unless its tenant, its model's queue or its idempotency key refuses it;
        `wait`: the replicas the writes must reach, asked in the same round trip."""
        queue = self.keys.model(job.model)
        tenant = job.tenant
        share = tenant or DEFAULT_SHARE
        share_name = batch_share(share.name) if job.batch else share.name
        fields = {**(self.keys.tenant_record_fields(tenant.name) if tenant else {}), **job.annotations}
        if job.batch:
            fields["batch"] = self.keys.batch(job.batch)
            fields["batch_ended"] = self.keys.batch_ended(job.batch)
        if job.prompt_tokens is not None:
            fields.update(share.token_costs(job.prompt_tokens))
        stream = self.keys.stream(job.job_id)
        keys = [
            self.keys.job(job.job_id),
            "" if self.split else stream,
            self.keys.idempotency(job.idempotency_key, job.owner) if job.idempotency_key else "",
            queue.queue,
            *self._tenant_keys(tenant),
            queue.share_tenants,
            queue.share_state,
            queue.batch_share_tenants,
            self.keys.job_index if job.index_size else "",
            queue.deadlines,
            queue.prefix_blocks,
            self.keys.workers,
        ]
        args: SubmitArgs = {
            "id": job.job_id,
            "created_at": repr(job.created_at),
            "request": job.request_json,
            "digest": job.request_digest,
            "queued_event": event_json(job.queued),
            "owner": job.owner,
            "model": job.model,
            "lifetime": job.lifetime_seconds,
            "max_queued": job.max_queued,
            "maxlen": job.maxlen,
            "wakeup": queue.wakeup,
            "tenant": TenantArgs(name=tenant.name, limits=tenant.script_limits()) if tenant else None,
            "share": {
                "name": share_name,
                "prefix": queue.share_queue_prefix,
                "stride": repr(1 / share.weight),
                "priority": job.priority,
            },
            "job_prefix": self.keys.job(""),
            "fields": fields,
            "index_size": job.index_size,
            "deadline": None if job.deadline is None else repr(job.deadline),
            "blocks": list(job.prefix_blocks),
            "preferred": {"prefix": queue.preferred_prefix, "scale": PREFERRED_SCALE},
        }
        opened = False
        if self.split:  # the stream first: a record never exists without it
            opening: StreamOpenArgs = {
                "queued_event": args["queued_event"],
                "maxlen": job.maxlen,
                "lifetime": job.lifetime_seconds,
            }
            opened = bool(await scripts.STREAM_OPEN(self.streams, [stream], opening))
            self.between("submit")
        (outcome, value, *rest), acked = await self._run(scripts.SUBMIT, keys, args, wait)
        if opened and outcome != SubmitOutcome.created.value:
            await self.streams.delete(stream)  # no record was made: nothing names this stream
        if outcome == SubmitOutcome.overloaded.value:
            return Submitted(SubmitOutcome.overloaded, "", int(value))
        if outcome == SubmitOutcome.rate_limited.value:
            retry_after, count, limit = map(int, rest)
            refusal = TenantRefusal(value, retry_after, count, limit)
            return Submitted(SubmitOutcome.rate_limited, "", refusal=refusal)
        return Submitted(SubmitOutcome(outcome), value, acked=acked)

    async def start(
        self,
        *,
        job_id: str,
        worker_id: str,
        model: str,
        now: float,
        running: StatusEvent,
        expired: ErrorEvent,
        maxlen: int,
        lease_seconds: float,
        retention_seconds: int,
        lifetime_seconds: int,
    ) -> StartAnswer:
        """`model`: the model the worker serves, whose queue it claimed the job from."""
        keys = [
            *self._job_keys(job_id),
            self.keys.model(model).queue,
            self.keys.lease(job_id),
            self.keys.running,
            *self._announce_keys(job_id),
            self.keys.model(model).deadlines,
            self.keys.jobs_expired,
        ]
        args: StartArgs = {
            "notices": self.keys.notices_of(job_id),
            "id": job_id,
            "worker": worker_id,
            "now": repr(now),
            "running_event": event_json(running),
            "expired_event": event_json(expired),
            "expired_message": expired.message,
            "maxlen": maxlen,
            "lease_ms": int(lease_seconds * 1000),
            "retention": retention_seconds,
            "lifetime": lifetime_seconds,
            "share_prefix": self.keys.model(model).share_queue_prefix,
        }
        outcome, *values = await scripts.START(self.redis, keys, args)
        if outcome == StartOutcome.running.value:
            request, created_at, conversation, asked = values
            answer = StartAnswer(
                StartOutcome.running, request, float(created_at), 1, conversation=conversation
            )
        elif outcome == StartOutcome.resumed.value:
            request, created_at, attempt, entries, conversation, asked = values
            answer = StartAnswer(
                StartOutcome.resumed, request, float(created_at), int(attempt), _fields(entries), conversation
            )
        else:
            if outcome == StartOutcome.expired.value:
                await self._expired_stream("start", job_id, expired, maxlen, retention_seconds, now)
            return StartAnswer(StartOutcome(outcome))
        if not self.split:
            return answer
        self.between("start")
        # The writer after the lease, and the stream read after the writer: nothing an earlier
        # worker appends can come after this reading.
        taking: StreamTakeArgs = {
            "worker": worker_id,
            "asked_at": asked or None,
            "running_event": args["running_event"] if answer.outcome is StartOutcome.running else None,
            "lifetime": lifetime_seconds,
            "maxlen": maxlen,
            **self._notices_of(job_id),
        }
        taken, *read = await scripts.STREAM_TAKE(
            self.streams, [self.keys.stream(job_id), self.keys.writer(job_id)], taking
        )
        if taken == StartOutcome.running.value:
            return answer
        if taken == "missing":  # its stream is gone (a failover lost it): nothing to run it on
            return StartAnswer(StartOutcome.refused)
        outcome = StartOutcome.ended if taken == StartOutcome.ended.value else StartOutcome.resumed
        return StartAnswer(
            outcome, answer.request, answer.created_at, answer.attempt, _fields(read[0]), answer.conversation
        )

    async def expire(
        self,
        *,
        job_id: str,
        model: str,
        now: float,
        expired: ErrorEvent,
        maxlen: int,
        retention_seconds: int,
    ) -> ExpireOutcome:
        """A queued job of `model` whose deadline has come fails unrun, as a worker's start would end it
        (`expire.lua`); the sweep of `model`'s `deadlines` calls it."""
        queue = self.keys.model(model)
        keys = [
            *self._job_keys(job_id),
            queue.queue,
            queue.deadlines,
            self.keys.jobs_expired,
            *self._announce_keys(job_id),
        ]
        args: ExpireArgs = {
            "notices": self.keys.notices_of(job_id),
            "id": job_id,
            "now": repr(now),
            "expired_event": event_json(expired),
            "expired_message": expired.message,
            "maxlen": maxlen,
            "retention": retention_seconds,
            "share_prefix": queue.share_queue_prefix,
        }
        answer = await scripts.EXPIRE(self.redis, keys, args)
        if answer != ExpireOutcome.expired.value:
            return ExpireOutcome.passed
        await self._expired_stream("expire", job_id, expired, maxlen, retention_seconds, now)
        return ExpireOutcome.expired

    async def _expired_stream(
        self,
        transition: str,
        job_id: str,
        expired: ErrorEvent,
        maxlen: int,
        retention_seconds: int,
        now: float,
    ) -> None:
        """With the streams apart, the end of the stream of a job whose deadline ended it, after its
        record's (`transition`'s)."""
        if not self.split:
            return
        self.between(transition)
        ending: list[tuple[str, str]] = [(expired.type, event_json(expired))]
        await self.end_stream(job_id, ending, maxlen=maxlen, retention_seconds=retention_seconds, now=now)

    def step_command(self, *, worker_id: str, steps: Sequence[JobStep], maxlen: int) -> tuple[Any, ...]:
        """The step script for `steps`, jobs of `worker_id`'s, as one pipeline command; its answer
        holds one answer a step, in their order, each read with `StepAnswer.of`. Not for streams in
        partitions (`step_calls`)."""
        return scripts.STEP.command(*self._step_parts(worker_id, steps, maxlen))

    def step_calls(self, *, worker_id: str, steps: Sequence[JobStep], maxlen: int) -> list[StepCall]:
        """`step_command`, as one call a partition when the streams are in partitions (a script
        names keys of one slot only), each publishing its notice on its partition's shard channel."""
        if not self.keys.partitions:
            return [StepCall(None, self.step_command(worker_id=worker_id, steps=steps, maxlen=maxlen))]
        groups: dict[int, list[int]] = {}
        for position, step in enumerate(steps):
            groups.setdefault(self.keys.partition(step.job_id), []).append(position)
        return [
            StepCall(
                positions,
                scripts.STEP.command(
                    *self._step_parts(worker_id, [steps[position] for position in positions], maxlen)
                ),
            )
            for positions in groups.values()
        ]

    async def step(self, *, worker_id: str, step: JobStep, maxlen: int) -> StepAnswer:
        """One job's step, sent on its own (a worker's publisher sends every job's in one call)."""
        (answer,) = await scripts.STEP(self.streams, *self._step_parts(worker_id, [step], maxlen))
        return StepAnswer.of(answer)

    def _step_parts(
        self, worker_id: str, steps: Sequence[JobStep], maxlen: int
    ) -> tuple[list[str], list[Any]]:
        """KEYS and ARGV as `step.lua` reads them: every job's lease (`fence`), then every job's stream; the
        call's `StepArgs`, its notices (channel, message) each, then every job's part. A message tells of
        the entries of one notice partition's streams, so that a gateway hears only the partitions of
        the streams it relays."""
        sent_at = str(time.time_ns() // 1_000_000)
        leases: list[str] = []
        streams: list[str] = []
        argv: list[Any] = []
        lines: dict[str, list[str]] = {}  # a notice channel: its message's lines
        fence = self.keys.writer if self.split else self.keys.lease
        for step in steps:
            job_id = step.job_id
            stream = self.keys.stream(job_id)
            leases.append(fence(job_id))
            streams.append(stream)
            trim = "1" if step.events and step.events[-1].seq >= maxlen else ""
            argv += StepJobArgs("1" if step.check else "", trim, len(step.events))
            if not step.events:
                continue
            channel = lines.setdefault(self.keys.notices_of(job_id), [])
            for event in step.events:
                data = event_json(event)
                entry_id = f"{event.seq}-1"
                argv += (entry_id, event.type, data)
                channel.append(notice_line(stream, entry_id, event.type, sent_at, data))
        publish = SHARD_PUBLISH if self.keys.partitions else PUBLISH
        notices = [part for channel, message in lines.items() for part in (channel, LINE.join(message))]
        keys = [*leases, *streams]
        return keys, [*StepArgs(worker_id, maxlen, int(sent_at), publish, len(lines)), *notices, *argv]

    def finish_commands(
        self,
        *,
        job_id: str,
        worker_id: str,
        state: JobState,
        events: list[Event],
        record_fields: dict[str, str],
        maxlen: int,
        retention_seconds: int,
    ) -> FinishCommands:
        """The finish script as a pipeline command (EVAL: it runs once a job), and with the streams
        apart the end of the stream before it; each answer reads with `Finished.of`."""
        keys = [
            *self._job_keys(job_id),
            self.keys.lease(job_id),
            self.keys.running,
            *self._announce_keys(job_id),
        ]
        pairs: list[tuple[str, str]] = [(event.type, event_json(event)) for event in events]
        args: FinishArgs = {
            "notices": self.keys.notices_of(job_id),
            "id": job_id,
            "worker": worker_id,
            "state": state.value,
            "maxlen": maxlen,
            "retention": retention_seconds,
            "events": pairs[-1:] if self.split else pairs,  # apart: the terminal one, for the record
            "fields": record_fields,
        }
        record = scripts.FINISH.eval_command(keys, args)
        if not self.split:
            return FinishCommands(None, record)
        ending: StreamEndArgs = {
            "holder": worker_id,
            "asked_at": "",
            "events": pairs,
            "maxlen": maxlen,
            "retention": retention_seconds,
            **self._notices_of(job_id),
        }
        stream_keys = [self.keys.stream(job_id), self.keys.writer(job_id)]
        return FinishCommands(scripts.STREAM_END.eval_command(stream_keys, ending), record)

    async def cancel(
        self,
        *,
        job_id: str,
        model: str,
        now: float,
        cancelled: Event,
        maxlen: int,
        retention_seconds: int,
        lifetime_seconds: int,
        stream_tip: str = "",
        record_fields: dict[str, str] | None = None,
        wait: Wait | None = None,
    ) -> CancelResult:
        """`model`: the job's model (its record's), whose queue a queued job leaves. A running job no
        worker holds ends only given `stream_tip`, the id of the stream's last entry ('0-0' for none),
        and the record's fields computed from the stream up to it (`cancel.lua`); `cancelled` is
        then numbered after that entry."""
        keys = [
            *self._job_keys(job_id),
            self.keys.model(model).queue,
            *self._announce_keys(job_id),
            self.keys.lease(job_id),
            self.keys.running,
            self.keys.model(model).deadlines,
        ]
        args: CancelArgs = {
            "notices": self.keys.notices_of(job_id),
            "id": job_id,
            "now": repr(now),
            "cancelled_event": event_json(cancelled),
            "maxlen": maxlen,
            "retention": retention_seconds,
            "lifetime": lifetime_seconds,
            "share_prefix": self.keys.model(model).share_queue_prefix,
            "stream_tip": stream_tip,
            "fields": record_fields or {},
        }
        if self.split and not stream_tip:
            # The writer of a running job carries the ask first: should the caller stop before the
            # record has it, the worker's next step ends the job all the same.
            marking: WriterMarkArgs = {"asked_at": repr(now)}
            await scripts.WRITER_MARK(self.streams, [self.keys.writer(job_id)], marking)
            self.between("cancel asked")
        (outcome, *state), acked = await self._run(scripts.CANCEL, keys, args, wait)
        if self.split:
            self.between("cancel")
            ending = (cancelled.type, event_json(cancelled))
            await self._cancel_stream(job_id, CancelOutcome(outcome), state, ending, retention_seconds, now)
        return CancelResult(CancelOutcome(outcome), JobState(state[0]) if state else None, acked)

    async def _cancel_stream(
        self,
        job_id: str,
        outcome: CancelOutcome,
        answer: list[str],
        cancelled: tuple[str, str],
        retention_seconds: int,
        now: float,
    ) -> None:
        """With the streams apart, a cancel's part there after the record's (a running job's writer
        carries the ask already): the stream of a job it ended ends; the writer of a job no worker
        holds goes (held by the worker that last ran it) before its caller reads the stream to end it."""
        if outcome is CancelOutcome.cancelled:
            retention = retention_seconds
            await self.end_stream(job_id, [cancelled], maxlen=None, retention_seconds=retention, now=now)
        elif outcome is CancelOutcome.unheld and answer[1]:
            await self.drop_writer(job_id, answer[1])

    async def tenant_usage(self, tenant: str) -> TenantUsage:
        """The tenant's counters, as its next submission's admission counts them (`tenant_usage.lua`)."""
        keys = self.keys
        counters = [
            keys.tenant_queued(tenant),
            keys.tenant_running(tenant),
            keys.tenant_requests(tenant),
            keys.tenant_tokens(tenant),
            keys.tenant_totals,
        ]
        args: TenantUsageArgs = {"tenant": tenant, "job_prefix": keys.job("")}
        queued, running, requests, tokens, tokens_total, jobs_total = await scripts.TENANT_USAGE(
            self.redis, counters, args
        )
        return TenantUsage(
            queued_jobs=queued,
            running_jobs=running,
            requests_last_minute=requests,
            tokens_last_minute=tokens,
            tokens_total=tokens_total,
            jobs_ended_total=jobs_total,
        )

    async def delete(self, *, job_id: str, wait: Wait | None = None) -> DeleteResult:
        keys = self._job_keys(job_id)
        (outcome, *state), acked = await self._run(scripts.DELETE, keys, [], wait)
        if self.split and outcome == DeleteOutcome.deleted.value:
            self.between("delete")
            await self.streams.delete(self.keys.stream(job_id), self.keys.writer(job_id))
        return DeleteResult(DeleteOutcome(outcome), JobState(state[0]) if state else None, acked)

    async def renew(
        self,
        *,
        worker_id: str,
        job_ids: list[str],
        lease_seconds: float,
        lifetime_seconds: int,
        extend: Collection[str],
    ) -> list[str]:
        """Extend the leases `worker_id` holds on `job_ids`, and the record and stream of those of them
        in `extend` to `lifetime_seconds`; answers the jobs whose lease it lost."""
        wanted = set(extend)
        positions = [position for position, job_id in enumerate(job_ids, 1) if job_id in wanted]
        keys = [self.keys.lease(job_id) for job_id in job_ids]
        for position in positions:
            job_id = job_ids[position - 1]
            keys += [self.keys.job(job_id), "" if self.split else self.keys.stream(job_id)]
        args: RenewArgs = {
            "worker": worker_id,
            "lease_ms": int(lease_seconds * 1000),
            "lifetime": lifetime_seconds,
            "extend": positions,
        }
        lost = [job_ids[position - 1] for position in await scripts.RENEW(self.redis, keys, args)]
        extended = [job_ids[position - 1] for position in positions]
        if self.split and extended:  # the streams and writers of the jobs still held live as long
            async with self.streams.pipeline(transaction=False) as pipe:
                for job_id in set(extended).difference(lost):
                    pipe.expire(self.keys.stream(job_id), lifetime_seconds)
                    pipe.expire(self.keys.writer(job_id), lifetime_seconds)
                await pipe.execute()
        return lost

    async def release(
        self,
        *,
        job_id: str,
        model: str,
        worker_id: str,
        attempt: int,
        max_attempts: int,
        now: float,
        message: str,
        failure: Failure | None,
        lifetime_seconds: int,
        retention_seconds: int,
        maxlen: int,
    ) -> ReleaseOutcome:
        """`model`: the job's model (its record's), whose queue a requeued job goes back to."""
        queue = self.keys.model(model)
        keys = [
            *self._job_keys(job_id),
            self.keys.lease(job_id),
            self.keys.running,
            queue.queue,
            *self._announce_keys(job_id),
            queue.share_tenants,
            queue.share_state,
            queue.batch_share_tenants,
        ]
        args: ReleaseArgs = {
            "notices": self.keys.notices_of(job_id),
            "id": job_id,
            "worker": worker_id,
            "attempt": attempt,
            "max_attempts": max_attempts,
            "lifetime": lifetime_seconds,
            "now": repr(now),
            "retention": retention_seconds,
            "maxlen": maxlen,
            "message": message,
            "wakeup": queue.wakeup,
            "share_prefix": queue.share_queue_prefix,
            "failure": failure.args() if failure else None,
        }
        outcome, *holder = await scripts.RELEASE(self.redis, keys, args)
        if self.split:  # after the record's: the job is no longer the worker's, nor its stream
            self.between("release")
            if outcome == ReleaseOutcome.requeued.value and holder and holder[0]:
                await self.drop_writer(job_id, holder[0], lifetime_seconds)
            elif outcome == ReleaseOutcome.exhausted.value and holder and holder[0]:
                await self.drop_writer(job_id, holder[0])
            elif outcome == ReleaseOutcome.failed.value and failure is not None:
                failed: list[tuple[str, str]] = [(failure.event.type, event_json(failure.event))]
                await self.end_stream(
                    job_id, failed, maxlen=maxlen, retention_seconds=retention_seconds, now=now
                )
        return ReleaseOutcome(outcome)


@dataclass(frozen=True)
class Affinity:
    """How a worker's claims follow the prefixes its cache holds (`claim.lua`): `window` head jobs of
    a share looked at, a job left `wait_seconds` to the worker holding its prefix (or to a less loaded
    one), a worker's load counted for `stale_seconds` after its last claim, and its advertised blocks
    for `blocks_ttl_seconds` (`advertise`)."""

    window: int
    wait_seconds: float
    stale_seconds: float
    blocks_ttl_seconds: float


async def claim(
    redis: aioredis.Redis,
    *,
    keys: Keys,
    model: ModelKeys,
    worker_id: str,
    lease_seconds: float,
    read_limit: int,
    wanted: int,
    batch_wanted: int = 0,
    charges: Sequence[tuple[str, int]] = (),
    affinity: Affinity | None = None,
    running: int = 0,
) -> list[tuple[str, int]]:
    """Up to `wanted` of `model`'s queued jobs that no other worker has taken, picked fairly among
    the tenants' shares (`claim.lua`), each claimed for `worker_id`: (id, submission ms) pairs. Of
    them at most `batch_wanted` are batches' jobs, and only once no interactive job waits.
    `charges`: (job id, output tokens) of the jobs this worker ended since its last claim;
    `affinity`: prefer the jobs whose prefix this worker's cache holds (`running`: its jobs now).

    A function of its own, not a method: the worker's queue loop runs it on its own connections.
    """
    lease_prefix, lease_suffix = keys.lease_affixes
    args: ClaimArgs = {
        "worker": worker_id,
        "lease_ms": int(lease_seconds * 1000),
        "lease_prefix": lease_prefix,
        "lease_suffix": lease_suffix,
        "share_prefix": model.share_queue_prefix,
        "job_prefix": keys.job(""),
        "read_limit": read_limit,
        "wanted": wanted,
        "batch_wanted": batch_wanted,
        "charges": list(charges),
        "affinity": None
        if affinity is None
        else {
            "preferred_prefix": model.preferred_prefix,
            "scale": PREFERRED_SCALE,
            "running": running,
            "window": affinity.window,
            "wait_ms": int(affinity.wait_seconds * 1000),
            "stale_ms": int(affinity.stale_seconds * 1000),
            "blocks_ttl_ms": int(affinity.blocks_ttl_seconds * 1000),
        },
    }
    keys_used = [
        model.queue,
        model.share_tenants,
        model.batch_share_tenants,
        model.share_state,
        model.worker_loads,
        keys.workers,
        model.worker_blocks(worker_id),
    ]
    answer = await scripts.CLAIM(redis, keys_used, args)
    return [(job_id, int(float(score))) for job_id, score in zip(answer[::2], answer[1::2], strict=True)]


async def advertise(
    redis: aioredis.Redis,
    *,
    model: ModelKeys,
    worker_id: str,
    blocks: Sequence[str],
    capacity: int,
    ttl_seconds: float,
) -> None:
    """Tell that `worker_id`'s cache now holds `blocks`, a prompt's leading block hashes, keeping at
    most `capacity` of its blocks advertised (`advertise.lua`); they lapse `ttl_seconds` after its
    last claim or advertisement."""
    args: AdvertiseArgs = {
        "worker": worker_id,
        "blocks": list(blocks),
        "capacity": capacity,
        "ttl_ms": int(ttl_seconds * 1000),
        "index_ttl_ms": PREFIX_INDEX_TTL_MS,
    }
    await scripts.ADVERTISE(redis, [model.prefix_blocks, model.worker_blocks(worker_id)], args)


async def unclaim(
    redis: aioredis.Redis, *, keys: Keys, model: ModelKeys, job_id: str, worker_id: str
) -> None:
    """Let go of a job `worker_id` claimed and will not start (`unclaim.lua`), waking `model`'s workers."""
    args: UnclaimArgs = {"worker": worker_id, "wakeup": model.wakeup}
    await scripts.UNCLAIM(redis, [keys.lease(job_id)], args)
