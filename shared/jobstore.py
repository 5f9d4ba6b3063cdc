"""The job record: submitted, started, cancelled and finished through the lifecycle's scripts
(`shared.lifecycle`), and read back."""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any, TypeVar

import redis.asyncio as aioredis
from pydantic import TypeAdapter

from shared.chat import ChatMessage, ToolCall
from shared.config import RedisSettings
from shared.errors import IdempotencyMismatch, InvalidRequest, JobNotFound, Overloaded, RateLimited
from shared.events import (
    CancelledEvent,
    DoneEvent,
    ErrorEvent,
    Event,
    JobState,
    Progress,
    StatusEvent,
    Usage,
    event_adapter,
)
from shared.keys import ANONYMOUS_OWNER, Keys, share_member
from shared.lifecycle.planes import Lifecycle, Planes, planes_of
from shared.lifecycle.transitions import (
    CancelOutcome,
    DeleteOutcome,
    ExpireOutcome,
    Failure,
    FinishCommands,
    JobStep,
    NewJob,
    ReleaseOutcome,
    StartOutcome,
    StepAnswer,
    StepCall,
    SubmitOutcome,
    Transitions,
)
from shared.models import Target
from shared.redis_client import StreamsRedis, redis_errors
from shared.replication import ReplicaAcks
from shared.requests import (
    MAX_MESSAGES,
    MAX_PROMPT_CHARS,
    CancelAnswer,
    JobOutput,
    JobRecord,
    JobRequest,
)
from shared.scheduling import NO_PLACEMENT, Placement
from shared.tenants import Tenant, TenantUsage

FIRST_WORKER_SEQ = 2  # seq 0 is `queued` (submit), 1 is `running` (start)
EndEvent = TypeVar("EndEvent", CancelledEvent, ErrorEvent)
"""The last event of a job that ends from its stream, no worker writing it (`JobStore._end_from_stream`)."""
# Parsing an entry takes pydantic about 2 µs: past this many, a record's output is assembled in a
# thread, so that a long running job's record (100,000 entries: 0.2 s) holds no stream of the gateway.
LONG_STREAM = 1024
DEADLINE_EXCEEDED = "deadline_exceeded"
WORKER_LOST = "worker_lost"  # the code of a job's end once it has run `max_attempts` times
DEADLINE_PASSED = "the job's deadline passed before a worker could start it"
EXPIRED = ErrorEvent(seq=1, message=DEADLINE_PASSED, code=DEADLINE_EXCEEDED)
"""The last event of a job whose deadline passed while it was queued (after `queued`, seq 0)."""
SWEEP_GROUP = 100  # due deadlines read a group at a time
ANNOTATION = "annotation:"  # the record's fields an API layer above the job keeps there
CONVERSATION = "conversation"  # the record's field of a job that is a turn of a conversation
SUBMISSION_OVERHEAD_BYTES = 1024
"""What a submission writes besides its request and annotations, about: the record's other fields, the
`queued` event and the queue entries."""


def _timestamp(value: str) -> datetime:
    return datetime.fromtimestamp(float(value), tz=timezone.utc)


def _optional_timestamp(value: str | None) -> datetime | None:
    return _timestamp(value) if value else None


def _events(entries: Iterable[dict[str, str]]) -> list[Event]:
    """The events of stream entries (each a `type` and its JSON `data`)."""
    return [event_adapter.validate_json(fields["data"]) for fields in entries]


@dataclass(frozen=True)
class Submission:
    """A submitted job: new, or the one an earlier request with the same idempotency key made."""

    job_id: str
    created: bool
    status: JobState
    created_at: datetime


def written_bytes(request: JobRequest, annotations: Mapping[str, str] | None) -> int:
    """About how many bytes submitting `request` with `annotations` writes to Redis."""
    fields = (annotations or {}).items()
    kept = sum(len(ANNOTATION) + len(name.encode()) + len(value.encode()) for name, value in fields)
    return len(request.model_dump_json(exclude_none=True).encode()) + kept + SUBMISSION_OVERHEAD_BYTES


@dataclass(frozen=True)
class Turn:
    """A job that is a turn of a conversation: the conversation job `previous` ended (none: this turn
    begins it) goes before the job's own message `at` (after its instructions, which no later turn
    carries over). `earlier`: that conversation, as read when the job was made; never written.

    A conversation is stored once: each turn's record holds only its own messages, its output, and
    the id of the turn before it (its `conversation` field), so the bytes a turn writes are those of
    its own input, however long the conversation. Whoever needs the whole conversation (the gateway
    to check the prompt against the context, the worker to render it) reads it back turn by turn
    (`JobStore.conversation`).
    """

    at: int
    previous: str | None = None
    earlier: tuple[ChatMessage, ...] = ()

    @property
    def field(self) -> str:
        """The record's `conversation` field: `<at>` or `<at> <previous job id>`."""
        return f"{self.at} {self.previous}" if self.previous else str(self.at)

    @classmethod
    def of_field(cls, value: str | None) -> Turn | None:
        if not value:
            return None
        at, _, previous = value.partition(" ")
        return cls(int(at), previous or None)

    def whole(self, request: JobRequest) -> JobRequest:
        """`request` (the turn's own messages) with the earlier conversation in its place."""
        own = request.messages or []
        return request.model_copy(update={"messages": [*own[: self.at], *self.earlier, *own[self.at :]]})

    def own(self, request: JobRequest) -> JobRequest:
        """`request` (the whole conversation, as `whole` made it) with the turn's own messages alone."""
        messages = request.messages or []
        kept = [*messages[: self.at], *messages[self.at + len(self.earlier) :]]
        return request.model_copy(update={"messages": kept})


@dataclass(frozen=True)
class Started:
    """A job a worker has taken: what to generate, which run of the job this is, and where it stands."""

    request: JobRequest
    attempt: int
    progress: Progress
    submitted_at: float  # epoch seconds, the record's `created_at`
    turn: Turn | None = None  # where its messages join a conversation stored before it (`whole_request`)

    @property
    def resumed(self) -> bool:
        """Another worker ran the job before and handed it back (or lost it) midway."""
        return self.attempt > 1


TOOL_CALLS: TypeAdapter[list[ToolCall]] = TypeAdapter(list[ToolCall])
"""A record's `tool_calls` field, JSON."""


@dataclass(frozen=True)
class Outcome:
    """How a running job ended, as the record keeps it."""

    state: JobState
    text: str
    token_count: int
    usage: Usage
    finish_reason: str | None = None
    error: str | None = None
    reasoning: str | None = None  # where the pool parses a chat's output: its parts beside `text`
    tool_calls: list[ToolCall] | None = None
    result: dict[str, Any] | None = None  # a pooling job's answer, as its `done` event carries it

    @classmethod
    def of_stream(cls, events: list[Event]) -> Outcome:
        """How the job whose stream holds `events`, the last one terminal, ended."""
        output, end = JobOutput.of(Progress.of(events)), events[-1]
        if isinstance(end, DoneEvent):
            state, usage, finish_reason, error = JobState.completed, end.usage, end.finish_reason, None
        elif isinstance(end, CancelledEvent):
            state, usage, finish_reason, error = JobState.cancelled, end.usage, None, None
        else:
            state, finish_reason = JobState.failed, None
            usage = Usage(prompt_tokens=0, completion_tokens=output.token_count)
            error = end.message if isinstance(end, ErrorEvent) else None
        return cls(
            state,
            output.text,
            output.token_count,
            usage,
            finish_reason,
            error,
            reasoning=output.reasoning,
            tool_calls=output.tool_calls,
            result=end.result if isinstance(end, DoneEvent) else None,
        )

    def record_fields(self, finished_at: float) -> dict[str, str]:
        fields: dict[str, Any] = {
            "finished_at": finished_at,
            "text": self.text,
            "token_count": self.token_count,
            "usage": self.usage.model_dump_json(),
        }
        if self.finish_reason is not None:
            fields["finish_reason"] = self.finish_reason
        if self.error is not None:
            fields["error"] = self.error
        if self.reasoning:
            fields["reasoning"] = self.reasoning
        if self.tool_calls:
            fields["tool_calls"] = json.dumps([call.model_dump() for call in self.tool_calls])
        if self.result is not None:
            fields["result"] = json.dumps(self.result)
        return {name: str(value) for name, value in fields.items()}


class JobStore:
    """Creates, starts, cancels, finishes and reads job records."""

    def __init__(
        self,
        redis: aioredis.Redis,
        keys: Keys,
        settings: RedisSettings,
        streams: StreamsRedis | None = None,
        notice_partition: int | None = None,
    ) -> None:
        """`streams`: the Redis of the job streams when they have their own (`streams_redis_url`).
        `notice_partition`: the notice partition whose ids new jobs get (a gateway's own, so that it
        hears of the jobs it submits and few others); None: random ids."""
        self.redis = redis
        self.notice_partition = notice_partition
        self.keys = keys
        self.settings = settings
        lifecycle = Lifecycle(
            maxlen=settings.stream_maxlen,
            retention_seconds=settings.retention_seconds,
            lifetime_seconds=settings.job_lifetime_seconds,
            index_size=settings.job_index_size,
        )
        self.planes: Planes = planes_of(redis, keys, lifecycle, streams)
        """Where the streams are: the seam each transition's stream part goes through."""
        self.streams = self.planes.streams
        self.streams_apart = streams
        """The streams' own Redis, where they have one (`streams_redis_url`); None: `redis` holds them."""
        self._transitions = Transitions(redis, keys, lifecycle, self.planes)
        self.acks = self._acks(redis)
        self.stream_acks = self.acks if streams is None else self._stream_acks(streams)
        """The replicas a write to the streams' Redis must reach (a step's, a job's end): the control
        plane's where one Redis holds both."""

    def _stream_acks(self, streams: StreamsRedis) -> ReplicaAcks | None:
        """The streams' own Redis's; none on a Redis Cluster, whose masters each have replicas of their
        own (a WAIT counts those of the master it is sent to)."""
        return self._acks(streams) if isinstance(streams, aioredis.Redis) else None

    def _acks(self, redis: aioredis.Redis) -> ReplicaAcks:
        settings, keys = self.settings, self.keys
        return ReplicaAcks(
            redis,
            settings.min_replicas_to_ack,
            settings.replica_ack_timeout_ms,
            keys.replication_fence,
            keys.replicas_seen,
        )

    async def submit(
        self,
        request: JobRequest,
        *,
        model: str,
        idempotency_key: str | None = None,
        owner: str = ANONYMOUS_OWNER,
        max_queued: int,
        annotations: Mapping[str, str] | None = None,
        waiting: str | None = None,
        tenant: Tenant | None = None,
        turn: Turn | None = None,
        job_id: str | None = None,
        batch: str | None = None,
        wait_until: float | None = None,
        deadline: float | None = None,
        placement: Placement = NO_PLACEMENT,
    ) -> Submission:
        """Write record (with its owner and model), `queued` event and queue entry in one atomic round trip.

        `model`: the canonical name of the job's model, whose queue it joins (`request.model` may name
        an adapter of it too). `waiting`: why the job may wait, said in its `queued` event.

        `annotations`: what the API layer that made the job keeps beside it (read back with
        `annotations`), written in the same step, so that no job exists without them. `turn`: the job
        is a turn of a conversation, and `request` holds its own messages alone (`Turn`).

        An idempotency key is the owner's own: another owner's same key makes another job. The
        same key with another request is refused (`IdempotencyMismatch`), as payment APIs do: a
        replay answers for the job its key was first used for, and that job is another's answer.
        `max_queued` jobs in the model's queue refuse another (`Overloaded`); 0 sets no limit. A `tenant`
        at one of its limits refuses it too (`RateLimited`), checked in the same atomic step.

        `job_id`: the job's id, given where the caller must find the job again (a batch's line, whose
        id `shared.batches.line_job_id` derives): a job of that id that exists is answered as a replay.
        `batch`: the id of the batch the job is a line of (it waits in the batch band). `wait_until`: the
        time until which the job's keys must outlive a wait in the queue, when that is longer than a
        job lifetime from now (a batch's line waits until its window's end). `deadline`: when the job,
        still queued, fails unrun (unix seconds), where `request` names none (an API's header, the
        gateway's default); the request's own `deadline` comes first. `placement`: what the queue
        knows of the prompt (`shared.scheduling`): its cost against the tenant's share, its prefix.

        Acknowledged only once the replicas `acks` asks for hold the job; short of them,
        `BackendUnavailable` says the job may exist (a retry with the same idempotency key finds it).
        """
        if job_id is None:
            partition = self.notice_partition
            job_id = uuid.uuid4().hex if partition is None else self.keys.job_id_in(partition)
        now = time.time()
        job = NewJob(
            job_id=job_id,
            created_at=now,
            request=request,
            queued=StatusEvent(seq=0, state=JobState.queued, message=waiting),
            owner=owner,
            model=model,
            max_queued=max_queued,
            idempotency_key=idempotency_key,
            fields={
                **{ANNOTATION + name: value for name, value in (annotations or {}).items()},
                **({CONVERSATION: turn.field} if turn else {}),
            },
            tenant=tenant,
            batch=batch,
            keep_until=wait_until,
            deadline=deadline,
            placement=placement,
        )
        with redis_errors():
            wait = await self.acks.wait()
            submitted = await self._transitions.submit(job, wait)
        if submitted.outcome in (SubmitOutcome.created, SubmitOutcome.existing):
            then = "; the job may exist: retry with the same Idempotency-Key to find it"
            self.acks.check(wait, submitted.acked, f"job {submitted.job_id}", then)
        if submitted.outcome is SubmitOutcome.overloaded:
            raise Overloaded(f"the queue holds {submitted.queue_depth} jobs, its limit is {max_queued}")
        if (refusal := submitted.refusal) is not None:
            raise RateLimited(
                f"{refusal.limit}: the tenant is at {refusal.count} of {refusal.value}; "
                f"retry after {refusal.retry_after} s",
                limit=refusal.limit,
                retry_after=refusal.retry_after,
            )
        if submitted.outcome is SubmitOutcome.mismatch:
            raise IdempotencyMismatch(
                f"this Idempotency-Key was used for job {submitted.job_id} with another request body; "
                "use a new key for a new request"
            )
        if submitted.outcome is SubmitOutcome.created:
            return Submission(job_id, True, JobState.queued, datetime.fromtimestamp(now, tz=timezone.utc))
        # Replayed: the job an earlier request with this key made.
        job_id = submitted.job_id
        with redis_errors():
            status, created_at = await self.redis.hmget(self.keys.job(job_id), ["status", "created_at"])  # type: ignore[misc]
        if status is None:
            raise JobNotFound(f"job {job_id} of this idempotency key has expired")
        return Submission(job_id, False, JobState(status), _timestamp(created_at))

    async def start(self, job_id: str, worker_id: str, model: str, *, lease_seconds: float) -> Started | None:
        """Take a queued job of `model` (the worker's, whose queue it came from), or resume a
        handed-back one, under this worker's lease; its keys then live a job lifetime from now,
        however long it waited.

        None when there is nothing to run: the job was cancelled, another worker holds it, or
        its deadline passed while it was queued (then it has failed with `deadline_exceeded`).
        """
        with redis_errors():
            answer = await self._transitions.start(
                job_id=job_id,
                worker_id=worker_id,
                model=model,
                now=time.time(),
                running=StatusEvent(seq=1, state=JobState.running, attempt=1),
                expired=EXPIRED,
                lease_seconds=lease_seconds,
            )
        turn = Turn.of_field(answer.conversation)
        if answer.outcome is StartOutcome.ended:
            await self._settle(job_id, worker_id, answer.entries)
            return None
        if answer.outcome is StartOutcome.running:
            request = JobRequest.model_validate_json(answer.request)
            return Started(request, 1, Progress(FIRST_WORKER_SEQ), answer.created_at, turn)
        if answer.outcome is StartOutcome.resumed:
            request = JobRequest.model_validate_json(answer.request)
            progress = Progress.of(_events(answer.entries))
            return Started(request, answer.attempt, progress, answer.created_at, turn)
        return None

    async def expire_due(self, models: Iterable[str]) -> int:
        """End the queued jobs of `models` whose deadline has come, which no worker started in time (none
        is live, or all are busy), as a worker's start would have ended them: failed with
        `deadline_exceeded`, without running. Answers how many it ended."""
        ended = 0
        for model in models:
            deadlines = self.keys.model(model).deadlines
            now = time.time()
            while True:
                with redis_errors():
                    due = await self.redis.zrangebyscore(deadlines, "-inf", now, start=0, num=SWEEP_GROUP)
                    for job_id in due:
                        outcome = await self._transitions.expire(
                            job_id=job_id, model=model, now=now, expired=EXPIRED
                        )
                        ended += outcome is ExpireOutcome.expired
                if len(due) < SWEEP_GROUP:  # each call took its job out of the range read
                    break
        return ended

    async def whole_request(self, started: Started) -> JobRequest:
        """What a started job generates from: a turn of a conversation with the conversation before it
        read back (`conversation`), any other job as it was submitted."""
        turn = started.turn
        if turn is None or turn.previous is None:
            return started.request
        earlier = await self.conversation(turn.previous)
        return Turn(turn.at, turn.previous, earlier).whole(started.request)

    async def own_messages(self, job_id: str) -> list[ChatMessage]:
        """The messages a turn of a conversation added (its request's past its instructions); a job
        that is no turn of one: its request's messages (`JobNotFound` if there is no such job)."""
        with redis_errors():
            request, field = await self.redis.hmget(self.keys.job(job_id), ["request", CONVERSATION])  # type: ignore[misc]
        if request is None:
            raise JobNotFound(f"no job {job_id}")
        turn = Turn.of_field(field) or Turn(0)
        return (JobRequest.model_validate_json(request).messages or [])[turn.at :]

    async def conversation(self, job_id: str) -> tuple[ChatMessage, ...]:
        """The conversation job `job_id` ended: each turn's own messages then its output (as the
        assistant's: its text, reasoning and tool calls), oldest turn first, read one turn at a time
        from its record back to the turn that began the conversation.

        Each record read is kept at least a job lifetime from now, so that a conversation outlives the
        jobs that go on from it. `JobNotFound` (naming the turn's job in `job_id`) when a turn is gone,
        deleted or past its retention; `InvalidRequest` when the conversation holds more messages or
        characters than one request may (`MAX_MESSAGES`, `MAX_PROMPT_CHARS`).
        """
        turns: list[list[ChatMessage]] = []
        messages = chars = 0
        turn_id: str | None = job_id
        while turn_id is not None:
            record = self.keys.job(turn_id)
            with redis_errors():
                async with self.redis.pipeline(transaction=False) as pipe:
                    pipe.hmget(record, ["request", "text", "reasoning", "tool_calls", CONVERSATION])
                    pipe.expire(record, self.settings.job_lifetime_seconds, gt=True)
                    (request, text, reasoning, calls, field), _ = await pipe.execute()
            if request is None:
                raise JobNotFound(f"no job {turn_id}: a turn of the conversation is gone", job_id=turn_id)
            turn = Turn.of_field(field) or Turn(0)
            own = (JobRequest.model_validate_json(request).messages or [])[turn.at :]
            answer = ChatMessage(
                role="assistant",
                content=text or "",
                reasoning=reasoning,
                tool_calls=None if calls is None else TOOL_CALLS.validate_json(calls),
            )
            turns.append([*own, answer])
            messages += len(turns[-1])
            chars += sum(message.chars for message in turns[-1])
            if messages > MAX_MESSAGES or chars > MAX_PROMPT_CHARS:
                raise InvalidRequest(
                    f"the conversation holds more than one request may: {MAX_MESSAGES} messages, "
                    f"{MAX_PROMPT_CHARS} characters"
                )
            turn_id = turn.previous
        return tuple(message for turn_messages in reversed(turns) for message in turn_messages)

    async def _settle(self, job_id: str, worker_id: str, entries: list[dict[str, str]]) -> None:
        """End the record of a job whose stream ends already (an earlier run's end reached the stream
        and not the record: its worker stopped between the two) as the stream says; `worker_id` has
        just started it, so holds its lease."""
        events = _events(entries)
        commands = self.finish_commands(job_id, worker_id, [], Outcome.of_stream(events))
        with redis_errors():
            await self.redis.execute_command(*commands.record)  # type: ignore[no-untyped-call]

    def finish_commands(
        self, job_id: str, worker_id: str, events: list[Event], outcome: Outcome
    ) -> FinishCommands:
        """Pipeline commands that append the last events (terminal last) and end a running job, if
        this worker still holds its lease: one script, or with the streams apart the stream's end
        first, then the record's; each answer reads with `Finished.of` (`shared.lifecycle.transitions`)."""
        return self._transitions.finish_commands(
            job_id=job_id,
            worker_id=worker_id,
            state=outcome.state,
            events=events,
            record_fields=outcome.record_fields(time.time()),
        )

    def step_calls(self, worker_id: str, steps: list[JobStep]) -> list[StepCall]:
        """The step script for `steps`, jobs of `worker_id`'s, as pipeline commands: one, or one a
        partition of the streams (`shared.lifecycle.transitions`); each answer reads with `StepAnswer.of`."""
        return self._transitions.step_calls(worker_id=worker_id, steps=steps)

    def step_command(self, worker_id: str, steps: list[JobStep]) -> tuple[object, ...]:
        """`step_calls` as one command, where the streams are in no partitions."""
        return self._transitions.step_command(worker_id=worker_id, steps=steps)

    async def step(self, worker_id: str, step: JobStep) -> StepAnswer:
        """One job's step, sent on its own (a worker's publisher sends every job's in one call)."""
        return await self._transitions.step(worker_id=worker_id, step=step)

    async def renew(
        self, worker_id: str, job_ids: list[str], *, lease_seconds: float, extend: Iterable[str]
    ) -> list[str]:
        """Extend the leases `worker_id` holds on `job_ids`, and the keys of those of them in `extend`
        to a job lifetime from now; answers the jobs whose lease it lost."""
        return await self._transitions.renew(
            worker_id=worker_id, job_ids=job_ids, lease_seconds=lease_seconds, extend=list(extend)
        )

    async def release(
        self,
        job_id: str,
        model: str,
        message: str,
        *,
        worker_id: str = "",
        attempt: int = 0,
        max_attempts: int,
    ) -> ReleaseOutcome:
        """Requeue a running job of `model` (its record's) for another worker to resume, or once it has
        run `max_attempts` times fail it with `worker_lost` and `message`, its output what its stream
        holds (`release.lua`).

        Without `worker_id`, only a lapsed lease is released (a reaper's call); with it, also that
        worker's own, of the run `attempt` only (0: any run)."""
        failure = None
        while True:
            with redis_errors():
                outcome = await self._transitions.release(
                    job_id=job_id,
                    model=model,
                    worker_id=worker_id,
                    attempt=attempt,
                    max_attempts=max_attempts,
                    now=time.time(),
                    message=message,
                    failure=failure,
                )
            if outcome is not ReleaseOutcome.exhausted:
                return outcome
            # The script dropped the lease: nothing writes to the stream any more.
            failure = await self._lost_end(job_id, message)

    async def _lost_end(self, job_id: str, message: str) -> Failure:
        """How a job out of attempts fails: an `error` event after its stream's last, and the output
        the stream holds."""

        def lost(progress: Progress) -> ErrorEvent:
            return ErrorEvent(seq=progress.next_seq, message=message, code=WORKER_LOST)

        event, tip, fields = await self._end_from_stream(job_id, lost)
        return Failure(event, fields, tip or "")

    async def cancel(self, job_id: str) -> tuple[CancelAnswer, bool]:
        """Cancel a queued job at once, and so a running one no worker holds (handed back to wait for
        another, or its worker gone): no step of it is to come. Ask the worker of a running one to
        stop. Idempotent.

        Also answers whether the cancel took effect (False: the job had already ended), once the
        replicas `acks` asks for hold it.
        """
        model = await self.model_of(job_id)
        cancelled: Event = CancelledEvent(seq=1, usage=Usage(prompt_tokens=0, completion_tokens=0))
        fields: dict[str, str]
        stream_tip, fields = "", {}  # a queued job's: nothing read from its stream
        while True:
            with redis_errors():
                wait = await self.acks.wait()
                result = await self._transitions.cancel(
                    job_id=job_id,
                    model=model,
                    now=time.time(),
                    cancelled=cancelled,
                    stream_tip=stream_tip,
                    record_fields=fields,
                    wait=wait,
                )
            if result.outcome is not CancelOutcome.unheld:
                break
            cancelled, tip, fields = await self._end_from_stream(job_id, _cancelled)
            stream_tip = tip or "0-0"
        if result.outcome in (CancelOutcome.cancelled, CancelOutcome.asked):
            self.acks.check(wait, result.acked, f"the cancel of job {job_id}")
        state = result.state
        if state is None:
            raise JobNotFound(f"no job {job_id}")
        if result.outcome is CancelOutcome.cancelled:
            message = "cancelled while no worker held it" if stream_tip else "cancelled before it ran"
            return CancelAnswer(id=job_id, status=state, message=message), True
        if result.outcome is CancelOutcome.asked:
            message = "cancel requested; the stream ends with 'cancelled'"
            return CancelAnswer(id=job_id, status=state, message=message), True
        return CancelAnswer(
            id=job_id, status=state, message=f"job already {state.value}; nothing changed"
        ), False

    async def _end_from_stream(
        self, job_id: str, ending: Callable[[Progress], EndEvent]
    ) -> tuple[EndEvent, str | None, dict[str, str]]:
        """How a running job that no worker writes to any more ends, from its stream as it stands: its
        last event (`ending` of what the stream holds), the id of the stream's last entry (None for
        none), and the record's fields, with the whole output the stream holds (text, reasoning, tool
        calls) and its usage, as a worker's end writes them. The prompt's tokens are the worker's to
        count (it renders the prompt): 0 here."""
        with redis_errors():
            entries = await self.streams.xrange(self.keys.stream(job_id))
        if len(entries) > LONG_STREAM:
            end, fields = await asyncio.to_thread(_ended, entries, ending)
        else:
            end, fields = _ended(entries, ending)
        return end, entries[-1][0] if entries else None, fields

    async def delete(self, job_id: str) -> JobState:
        """Delete a finished job's keys now, before its retention ends; answers the state it had, once
        the replicas `acks` asks for hold the deletion (else a failover could bring the job back).

        `JobNotFound` if there is none; `InvalidRequest` if it is queued or running: a worker may
        still write to it (cancel it first)."""
        with redis_errors():
            wait = await self.acks.wait()
            result = await self._transitions.delete(job_id=job_id, wait=wait)
        if result.outcome is DeleteOutcome.deleted:
            self.acks.check(wait, result.acked, f"the deletion of job {job_id}", "; delete it again")
        if result.outcome is DeleteOutcome.missing or result.state is None:
            raise JobNotFound(f"no job {job_id}")
        if result.outcome is DeleteOutcome.unfinished:
            raise InvalidRequest(f"job {job_id} is still {result.state.value}: cancel it first")
        return result.state

    async def tenant_usage(self, tenant: str) -> TenantUsage:
        """The tenant's counters, as its next submission's admission counts them."""
        with redis_errors():
            return await self._transitions.tenant_usage(tenant)

    async def model_of(self, job_id: str) -> str:
        """The canonical name of the job's model, which names its queue; '' for no such job (whose
        scripts then find no record). A job's model never changes, so it is safe to read first."""
        with redis_errors():
            model: str | None = await self.redis.hget(self.keys.job(job_id), "model")  # type: ignore[misc]
        return model or ""

    async def check_owner(self, job_id: str, owner: str) -> None:
        """`JobNotFound` unless the job exists and is `owner`'s: another owner cannot tell it exists."""
        with redis_errors():
            recorded = await self.redis.hget(self.keys.job(job_id), "owner")  # type: ignore[misc]
        if recorded != owner:
            raise JobNotFound(f"no job {job_id}")

    async def annotations(self, job_id: str) -> dict[str, str]:
        """The fields the job's API layer kept beside it at submission (`JobNotFound` if none)."""
        with redis_errors():
            fields = await self.redis.hgetall(self.keys.job(job_id))  # type: ignore[misc]
        if not fields:
            raise JobNotFound(f"no job {job_id}")
        return {
            name[len(ANNOTATION) :]: value for name, value in fields.items() if name.startswith(ANNOTATION)
        }

    async def annotate(self, job_id: str, owner: str, annotations: Mapping[str, str]) -> None:
        """Change fields the job's API layer keeps beside it (`annotations`), in one step that checks
        the job is `owner`'s (`JobNotFound` otherwise) and never makes a record of a job gone."""
        fields = [part for name, value in annotations.items() for part in (ANNOTATION + name, value)]
        with redis_errors():
            changed = await self.redis.eval(_ANNOTATE, 1, self.keys.job(job_id), owner, *fields)  # type: ignore[misc]
        if not changed:
            raise JobNotFound(f"no job {job_id}")

    async def record(self, job_id: str) -> JobRecord:
        """The job record; while the job runs its output so far is read from its stream."""
        with redis_errors():
            fields = await self.redis.hgetall(self.keys.job(job_id))  # type: ignore[misc]
            if not fields:
                raise JobNotFound(f"no job {job_id}")
            state = JobState(fields["status"])
            # Only a queued job has a place, in its tenant's share of its model's queue: a second
            # round trip only then.
            rank = await self._queue_position(job_id, fields) if state is JobState.queued else None
        if state.terminal:
            output = JobOutput(
                text=fields.get("text", ""),
                token_count=int(fields.get("token_count", 0)),
                reasoning=fields.get("reasoning"),
                tool_calls=TOOL_CALLS.validate_json(fields["tool_calls"]) if "tool_calls" in fields else None,
                result=json.loads(fields["result"]) if "result" in fields else None,
            )
        else:
            output = await self._output_so_far(job_id)
        model = fields.get("model")
        qualified = json.loads(fields["request"]).get("model") if model else None
        return JobRecord(
            id=job_id,
            status=state,
            model=model,
            adapter=Target.of_job(qualified, model).adapter if model else None,
            worker=fields.get("worker"),
            created_at=_timestamp(fields["created_at"]),
            started_at=_optional_timestamp(fields.get("started_at")),
            finished_at=_optional_timestamp(fields.get("finished_at")),
            output=output,
            finish_reason=fields.get("finish_reason"),
            usage=Usage.model_validate_json(fields["usage"]) if "usage" in fields else None,
            error=fields.get("error"),
            queue_position=rank,
            attempts=int(fields.get("attempts", 0)),
        )

    async def _queue_position(self, job_id: str, fields: dict[str, str]) -> int | None:
        """How many jobs of its tenant come before the job in its model's queue (by priority, then
        age): other tenants' jobs take turns with them and do not count. A job a worker has claimed
        counts until that worker's start takes it out of the share, a moment later."""
        model = self.keys.model(fields.get("model", ""))
        if "share" not in fields:  # queued before tenants' shares: its place by age in the model's queue
            rank: int | None = await self.redis.zrank(model.queue, job_id)
            return rank
        member = share_member(float(fields["created_at"]), job_id)
        rank = await self.redis.zrank(model.share_queue_prefix + fields["share"], member)
        return rank

    async def _output_so_far(self, job_id: str) -> JobOutput:
        """The text and token count the stream holds so far. Read from the stream, not kept as the
        job runs: that would cost the worker a write per step for a read that is rare."""
        with redis_errors():
            entries = await self.streams.xrange(self.keys.stream(job_id))
        return await _output_of(entries)


_ANNOTATE = """
if redis.call('HGET', KEYS[1], 'owner') ~= ARGV[1] then return 0 end
if #ARGV > 1 then redis.call('HSET', KEYS[1], unpack(ARGV, 2)) end
return 1
"""


def _cancelled(progress: Progress) -> CancelledEvent:
    return CancelledEvent(
        seq=progress.next_seq, usage=Usage(prompt_tokens=0, completion_tokens=len(progress.token_ids))
    )


def _ended(
    entries: list[tuple[str, dict[str, str]]], ending: Callable[[Progress], EndEvent]
) -> tuple[EndEvent, dict[str, str]]:
    """`ending` of what stream `entries` hold, and the record's fields with it as the last event."""
    events: list[Event] = _events(fields for _, fields in entries)
    end = ending(Progress.of(events))
    return end, Outcome.of_stream([*events, end]).record_fields(time.time())


async def _output_of(entries: list[tuple[str, dict[str, str]]]) -> JobOutput:
    """The output stream entries hold, assembled in a thread past LONG_STREAM of them."""
    if len(entries) > LONG_STREAM:
        return await asyncio.to_thread(_output, entries)
    return _output(entries)


def _output(entries: list[tuple[str, dict[str, str]]]) -> JobOutput:
    return JobOutput.of(Progress.of(_events(fields for _, fields in entries)))
