"""One typed wrapper per lifecycle script: named parameters in, an enum (or a small result) out."""

from __future__ import annotations

import contextlib
import hashlib
import json
import time
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

import redis.asyncio as aioredis

from shared.batches import batch_share
from shared.events import ErrorEvent, Event, JobState, StatusEvent, event_json
from shared.keys import Keys
from shared.lifecycle import scripts
from shared.lifecycle.arguments import (
    CancelArgs,
    ExpireArgs,
    FailureArgs,
    FinishArgs,
    ReleaseArgs,
    RenewArgs,
    StartArgs,
    StepArgs,
    StepJobArgs,
    SubmitArgs,
    TenantArgs,
    TenantUsageArgs,
)
from shared.lifecycle.claims import PREFERRED_SCALE
from shared.lifecycle.planes import PUBLISH, SHARD_PUBLISH, Lifecycle, Planes
from shared.notices import LINE, notice_line
from shared.replication import Wait
from shared.requests import JobRequest
from shared.scheduling import NO_PLACEMENT, Placement
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

    @property
    def first(self) -> tuple[Any, ...]:
        """What goes in the steps' round trip, to the streams' Redis: the whole end on one Redis."""
        return self.record if self.stream is None else self.stream

    @property
    def then(self) -> tuple[Any, ...] | None:
        """What goes to the records' Redis once `first` ended the stream; None: nothing more."""
        return None if self.stream is None else self.record


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
    """How a job out of attempts fails: its last event and the record's fields, from the output its
    stream holds."""

    event: ErrorEvent
    fields: dict[str, str]
    stream_tip: str  # the id of the stream's last entry these were computed from ('' when empty)

    def args(self) -> FailureArgs:
        """The failure as the release script reads it."""
        return {"event": event_json(self.event), "fields": self.fields, "stream_tip": self.stream_tip}


@dataclass(frozen=True)
class NewJob:
    """A job to submit, as its caller describes it. `model`: the canonical name of the job's model,
    whose queue it joins; `queued`: its first event, saying why it may wait; `fields`: what the record
    keeps beside the job, for the API layer that made it; `tenant`: whose limits the job must fit,
    whose counters it joins and whose share of the queue it waits in (None: no tenant's; it waits in
    the default tenant's share), its order there the request's `priority`, lower first; `batch`: the
    batch the job is a line of, whose band it waits in (that tenant's share of the batch band:
    `shared.batches`) and whose record counts its end; `keep_until`: the time until which its keys must
    outlive a wait, when that is past a job lifetime from now; `deadline`: still queued then (unix
    seconds), the job fails unrun, where the request names none; `placement`: its prompt's tokens,
    counted against its tenant's share (None: the share counts jobs), and its leading block hashes,
    which find the worker whose cache holds them (`shared.scheduling`)."""

    job_id: str
    created_at: float
    request: JobRequest
    queued: StatusEvent
    owner: str
    model: str
    max_queued: int
    idempotency_key: str | None = None
    fields: dict[str, str] = field(default_factory=dict)
    tenant: Tenant | None = None
    batch: str | None = None
    keep_until: float | None = None
    deadline: float | None = None
    placement: Placement = NO_PLACEMENT

    @property
    def digest(self) -> str:
        """SHA-256 of the request as validated, in canonical JSON (keys sorted, defaults filled in), kept
        beside an idempotency key: two bodies that ask for the same job have the same digest, whatever
        their key order or spacing. '' without an idempotency key."""
        if not self.idempotency_key:
            return ""
        canonical = json.dumps(
            self.request.model_dump(mode="json", exclude_none=True), sort_keys=True, separators=(",", ":")
        )
        return hashlib.sha256(canonical.encode()).hexdigest()

    def lifetime(self, lifetime_seconds: int) -> int:
        """How long its keys live from submission: a job lifetime, and its wait until `keep_until`."""
        return lifetime_seconds + max(0, int((self.keep_until or self.created_at) - self.created_at))

    @property
    def due(self) -> float | None:
        """When it fails unrun, still queued: the request's own deadline first."""
        return self.request.deadline.timestamp() if self.request.deadline else self.deadline


def _fields(entries: list[Any]) -> list[dict[str, str]]:
    """Stream entries as XRANGE answers them inside a script, each entry's fields as a dict."""
    return [dict(zip(pairs[::2], pairs[1::2], strict=True)) for _, pairs in entries]


class Transitions:
    """The job lifecycle's scripts, each behind one method, for the jobs of one `Lifecycle`.

    `planes`: where the streams are (`shared.lifecycle.planes`); each transition that writes a stream
    calls it where its part there goes, in the order that keeps the job whole should the caller stop
    between the two (`shared.lifecycle`).
    """

    def __init__(self, redis: aioredis.Redis, keys: Keys, lifecycle: Lifecycle, planes: Planes) -> None:
        self.redis = redis
        self.keys = keys
        self.lifecycle = lifecycle
        self.planes = planes
        self.streams = planes.streams

    def _job_keys(self, job_id: str, model: str = "") -> list[str]:
        """`JobKeys` of the job and of `model`, as the scripts on `redis` take them first."""
        return self.planes.control(self.keys.of_job(job_id, model)).listed()

    def _tenant_keys(self, tenant: Tenant | None) -> list[str]:
        """The submit script's tenant's counters, '' each for a job of no tenant."""
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
        tenant, lifecycle = job.tenant, self.lifecycle
        share = tenant or DEFAULT_SHARE
        share_name = batch_share(share.name) if job.batch else share.name
        fields = {**(self.keys.tenant_record_fields(tenant.name) if tenant else {}), **job.fields}
        if job.batch:
            fields["batch"] = self.keys.batch(job.batch)
            fields["batch_ended"] = self.keys.batch_ended(job.batch)
        if job.placement.prompt_tokens is not None:
            fields.update(share.token_costs(job.placement.prompt_tokens))
        keys = [
            *self._job_keys(job.job_id, job.model),
            self.keys.idempotency(job.idempotency_key, job.owner) if job.idempotency_key else "",
            *self._tenant_keys(tenant),
            self.keys.job_index if lifecycle.index_size else "",
            queue.prefix_blocks,
            self.keys.workers,
        ]
        lifetime = job.lifetime(lifecycle.lifetime_seconds)
        due = job.due
        args: SubmitArgs = {
            "id": job.job_id,
            "created_at": repr(job.created_at),
            "request": job.request.model_dump_json(exclude_none=True),
            "digest": job.digest,
            "queued_event": event_json(job.queued),
            "owner": job.owner,
            "model": job.model,
            "lifetime": lifetime,
            "max_queued": job.max_queued,
            "maxlen": lifecycle.maxlen,
            "wakeup": queue.wakeup,
            "tenant": TenantArgs(name=tenant.name, limits=tenant.script_limits()) if tenant else None,
            "share": {
                "name": share_name,
                "prefix": queue.share_queue_prefix,
                "stride": repr(1 / share.weight),
                "priority": job.request.priority or 0,
            },
            "job_prefix": self.keys.job(""),
            "fields": fields,
            "index_size": lifecycle.index_size,
            "deadline": None if due is None else repr(due),
            "blocks": list(job.placement.prefix_blocks),
            "preferred": {"prefix": queue.preferred_prefix, "scale": PREFERRED_SCALE},
        }
        # The stream first, where it is apart: a record never exists without it.
        opened = await self.planes.open(job.job_id, args["queued_event"], lifetime)
        (outcome, value, *rest), acked = await self._run(scripts.SUBMIT, keys, args, wait)
        if opened and outcome != SubmitOutcome.created.value:
            await self.planes.refused(job.job_id)
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
        lease_seconds: float,
    ) -> StartAnswer:
        """`model`: the model the worker serves, whose queue it claimed the job from."""
        lifecycle = self.lifecycle
        args: StartArgs = {
            "notices": self.keys.notices_of(job_id),
            "id": job_id,
            "worker": worker_id,
            "now": repr(now),
            "running_event": event_json(running),
            "expired_event": event_json(expired),
            "expired_message": expired.message,
            "maxlen": lifecycle.maxlen,
            "lease_ms": int(lease_seconds * 1000),
            "retention": lifecycle.retention_seconds,
            "lifetime": lifecycle.lifetime_seconds,
            "share_prefix": self.keys.model(model).share_queue_prefix,
        }
        outcome, *values = await scripts.START(self.redis, self._job_keys(job_id, model), args)
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
                await self.planes.expired("start", job_id, expired, now)
            return StartAnswer(StartOutcome(outcome))
        first = args["running_event"] if answer.outcome is StartOutcome.running else None
        taken = await self.planes.take(job_id, worker_id, asked, first)
        if taken.outcome == StartOutcome.running.value:
            return answer
        if taken.outcome == "missing":  # its stream is gone (a failover lost it): nothing to run it on
            return StartAnswer(StartOutcome.refused)
        outcome = StartOutcome.ended if taken.outcome == StartOutcome.ended.value else StartOutcome.resumed
        return StartAnswer(
            outcome,
            answer.request,
            answer.created_at,
            answer.attempt,
            _fields(taken.entries or []),
            answer.conversation,
        )

    async def expire(self, *, job_id: str, model: str, now: float, expired: ErrorEvent) -> ExpireOutcome:
        """A queued job of `model` whose deadline has come fails unrun, as a worker's start would end it
        (`expire.lua`); the sweep of `model`'s `deadlines` calls it."""
        args: ExpireArgs = {
            "notices": self.keys.notices_of(job_id),
            "id": job_id,
            "now": repr(now),
            "expired_event": event_json(expired),
            "expired_message": expired.message,
            "maxlen": self.lifecycle.maxlen,
            "retention": self.lifecycle.retention_seconds,
            "share_prefix": self.keys.model(model).share_queue_prefix,
        }
        answer = await scripts.EXPIRE(self.redis, self._job_keys(job_id, model), args)
        if answer != ExpireOutcome.expired.value:
            return ExpireOutcome.passed
        await self.planes.expired("expire", job_id, expired, now)
        return ExpireOutcome.expired

    def step_command(self, *, worker_id: str, steps: Sequence[JobStep]) -> tuple[Any, ...]:
        """The step script for `steps`, jobs of `worker_id`'s, as one pipeline command; its answer
        holds one answer a step, in their order, each read with `StepAnswer.of`. Not for streams in
        partitions (`step_calls`)."""
        return scripts.STEP.command(*self._step_parts(worker_id, steps))

    def step_calls(self, *, worker_id: str, steps: Sequence[JobStep]) -> list[StepCall]:
        """`step_command`, as one call a partition when the streams are in partitions (a script
        names keys of one slot only), each publishing its notice on its partition's shard channel."""
        if not self.keys.partitions:
            return [StepCall(None, self.step_command(worker_id=worker_id, steps=steps))]
        groups: dict[int, list[int]] = {}
        for position, step in enumerate(steps):
            groups.setdefault(self.keys.partition(step.job_id), []).append(position)
        return [
            StepCall(
                positions,
                scripts.STEP.command(
                    *self._step_parts(worker_id, [steps[position] for position in positions])
                ),
            )
            for positions in groups.values()
        ]

    async def step(self, *, worker_id: str, step: JobStep) -> StepAnswer:
        """One job's step, sent on its own (a worker's publisher sends every job's in one call)."""
        (answer,) = await scripts.STEP(self.streams, *self._step_parts(worker_id, [step]))
        return StepAnswer.of(answer)

    def _step_parts(self, worker_id: str, steps: Sequence[JobStep]) -> tuple[list[str], list[Any]]:
        """KEYS and ARGV as `step.lua` reads them: every job's lease (its writer, apart: `Planes.fence`),
        then every job's stream; the call's `StepArgs`, its notices (channel, message) each, then every
        job's part. A message tells of the entries of one notice partition's streams, so that a gateway
        hears only the partitions of the streams it relays."""
        sent_at = str(time.time_ns() // 1_000_000)
        maxlen = self.lifecycle.maxlen
        leases: list[str] = []
        streams: list[str] = []
        argv: list[Any] = []
        lines: dict[str, list[str]] = {}  # a notice channel: its message's lines
        fence = self.planes.fence
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
    ) -> FinishCommands:
        """The finish script as a pipeline command (EVAL: it runs once a job), and with the streams
        apart the end of the stream before it; each answer reads with `Finished.of`."""
        pairs: list[tuple[str, str]] = [(event.type, event_json(event)) for event in events]
        args: FinishArgs = {
            "notices": self.keys.notices_of(job_id),
            "id": job_id,
            "worker": worker_id,
            "state": state.value,
            "maxlen": self.lifecycle.maxlen,
            "retention": self.lifecycle.retention_seconds,
            "events": self.planes.recorded_end(pairs),
            "fields": record_fields,
        }
        record = scripts.FINISH.eval_command(self._job_keys(job_id), args)
        return FinishCommands(self.planes.end_of_stream(job_id, worker_id, pairs), record)

    async def cancel(
        self,
        *,
        job_id: str,
        model: str,
        now: float,
        cancelled: Event,
        stream_tip: str = "",
        record_fields: dict[str, str] | None = None,
        wait: Wait | None = None,
    ) -> CancelResult:
        """`model`: the job's model (its record's), whose queue a queued job leaves. A running job no
        worker holds ends only given `stream_tip`, the id of the stream's last entry ('0-0' for none),
        and the record's fields computed from the stream up to it (`cancel.lua`); `cancelled` is
        then numbered after that entry."""
        lifecycle = self.lifecycle
        args: CancelArgs = {
            "notices": self.keys.notices_of(job_id),
            "id": job_id,
            "now": repr(now),
            "cancelled_event": event_json(cancelled),
            "maxlen": lifecycle.maxlen,
            "retention": lifecycle.retention_seconds,
            "lifetime": lifecycle.lifetime_seconds,
            "share_prefix": self.keys.model(model).share_queue_prefix,
            "stream_tip": stream_tip,
            "fields": record_fields or {},
        }
        if not stream_tip:
            await self.planes.ask_cancel(job_id, now)
        keys = self._job_keys(job_id, model)
        (outcome, *state), acked = await self._run(scripts.CANCEL, keys, args, wait)
        result = CancelOutcome(outcome)
        # A job no worker holds: its writer goes (held by the worker that last ran it) before its
        # caller reads the stream to end it.
        worker = state[1] if result is CancelOutcome.unheld else None
        ending = (cancelled.type, event_json(cancelled))
        await self.planes.cancelled(job_id, result is CancelOutcome.cancelled, worker, ending, now)
        return CancelResult(result, JobState(state[0]) if state else None, acked)

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
        (outcome, *state), acked = await self._run(scripts.DELETE, self._job_keys(job_id), [], wait)
        if outcome == DeleteOutcome.deleted.value:
            await self.planes.deleted(job_id)
        return DeleteResult(DeleteOutcome(outcome), JobState(state[0]) if state else None, acked)

    async def renew(
        self, *, worker_id: str, job_ids: list[str], lease_seconds: float, extend: Collection[str]
    ) -> list[str]:
        """Extend the leases `worker_id` holds on `job_ids`, and the record and stream of those of them
        in `extend` to a job lifetime; answers the jobs whose lease it lost."""
        wanted = set(extend)
        positions = [position for position, job_id in enumerate(job_ids, 1) if job_id in wanted]
        keys = [self.keys.lease(job_id) for job_id in job_ids]
        for position in positions:
            job = self.planes.control(self.keys.of_job(job_ids[position - 1], ""))
            keys += [job.record, job.stream]
        args: RenewArgs = {
            "worker": worker_id,
            "lease_ms": int(lease_seconds * 1000),
            "lifetime": self.lifecycle.lifetime_seconds,
            "extend": positions,
        }
        lost = [job_ids[position - 1] for position in await scripts.RENEW(self.redis, keys, args)]
        extended = [job_ids[position - 1] for position in positions]
        if extended:  # the streams (and writers) of the jobs still held live as long
            await self.planes.renewed(set(extended).difference(lost))
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
    ) -> ReleaseOutcome:
        """`model`: the job's model (its record's), whose queue a requeued job goes back to."""
        queue = self.keys.model(model)
        lifecycle = self.lifecycle
        args: ReleaseArgs = {
            "notices": self.keys.notices_of(job_id),
            "id": job_id,
            "worker": worker_id,
            "attempt": attempt,
            "max_attempts": max_attempts,
            "lifetime": lifecycle.lifetime_seconds,
            "now": repr(now),
            "retention": lifecycle.retention_seconds,
            "maxlen": lifecycle.maxlen,
            "message": message,
            "wakeup": queue.wakeup,
            "share_prefix": queue.share_queue_prefix,
            "failure": failure.args() if failure else None,
        }
        outcome, *holder = await scripts.RELEASE(self.redis, self._job_keys(job_id, model), args)
        failed = failure.event if failure is not None else None
        await self.planes.released(job_id, outcome, holder[0] if holder else "", failed, now)
        return ReleaseOutcome(outcome)
