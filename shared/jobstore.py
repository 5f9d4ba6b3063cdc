"""The job record and its state machine, kept atomic by Lua scripts run inside Redis.

States only move forward (queued -> running -> completed | cancelled | failed), and
each transition writes the record and the job's status or terminal event together,
so a reader can never see one without the other.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

import redis.asyncio as aioredis
from arq.jobs import serialize_job

from shared.config import Settings
from shared.errors import JobNotFound, Overloaded
from shared.events import (
    CancelledEvent,
    ErrorEvent,
    Event,
    JobState,
    Progress,
    StatusEvent,
    Usage,
    event_adapter,
)
from shared.keys import ANONYMOUS_OWNER, Keys
from shared.redis_client import redis_errors
from shared.requests import CancelAnswer, JobOutput, JobRecord, JobRequest

ARQ_FUNCTION = "run_job"
FIRST_WORKER_SEQ = 2  # seq 0 is `queued` (submit), 1 is `running` (start)
DEADLINE_EXCEEDED = "deadline_exceeded"
DEADLINE_PASSED = "the job's deadline passed before a worker could start it"

# KEYS: record, stream, idempotency ('' for none), queue, arq job
# ARGV: id, created_at, request, queued event, arq payload, lifetime, max queued, maxlen, score, owner,
#       wake-up channel
SUBMIT_LUA = """
if KEYS[3] ~= '' then
  local existing = redis.call('GET', KEYS[3])
  if existing then return {'existing', existing} end
end
local limit = tonumber(ARGV[7])
if limit > 0 then
  local depth = redis.call('ZCARD', KEYS[4])
  if depth >= limit then return {'overloaded', tostring(depth)} end
end
redis.call('HSET', KEYS[1], 'id', ARGV[1], 'status', 'queued', 'created_at', ARGV[2], 'request', ARGV[3],
           'owner', ARGV[10])
if KEYS[3] ~= '' then redis.call('HSET', KEYS[1], 'idempotency_key', KEYS[3]) end
redis.call('XADD', KEYS[2], 'MAXLEN', '~', ARGV[8], '*', 'type', 'status', 'data', ARGV[4])
redis.call('EXPIRE', KEYS[1], ARGV[6])
redis.call('EXPIRE', KEYS[2], ARGV[6])
redis.call('SET', KEYS[5], ARGV[5], 'EX', ARGV[6])
redis.call('ZADD', KEYS[4], ARGV[9], ARGV[1])
redis.call('PUBLISH', ARGV[11], ARGV[1])
if KEYS[3] ~= '' then redis.call('SET', KEYS[3], ARGV[1], 'EX', ARGV[6]) end
return {'created', ARGV[1], 'queued', ARGV[2]}
"""

# Once a job ends, every key it made expires after the retention period. The idempotency
# key's name is read from the record: single-instance Redis, not Redis Cluster.
EXPIRE_JOB_LUA = """
local function expire_job(retention)
  for i = 1, 3 do redis.call('EXPIRE', KEYS[i], retention) end
  local idempotency = redis.call('HGET', KEYS[1], 'idempotency_key')
  if idempotency then redis.call('EXPIRE', idempotency, retention) end
end
"""

# KEYS: record, stream, cancel, queue, lease, running, arq job
# ARGV: id, worker, model, now, running event, deadline error event, deadline message, maxlen,
#       lease ms, retention
# A queued job starts (attempt 1); a running one that a worker handed back (`requeued`) resumes
# with the next attempt, and the answer carries its stream so that the new worker continues
# where the last one stopped. The starting worker takes the job's lease and the job leaves
# arq's queue set, so that the set holds only waiting jobs. A queued job past its `deadline`
# fails instead, without ever running. The request's JSON is decoded only when it has one.
START_LUA = (
    EXPIRE_JOB_LUA
    + """
local function take(attempt)
  redis.call('HSET', KEYS[1], 'worker', ARGV[2], 'model', ARGV[3], 'attempts', attempt)
  redis.call('ZREM', KEYS[4], ARGV[1])
  redis.call('SET', KEYS[5], ARGV[2], 'PX', ARGV[9])
  redis.call('SADD', KEYS[6], ARGV[1])
end
local status, request, created = unpack(redis.call('HMGET', KEYS[1], 'status', 'request', 'created_at'))
if status == 'running' and redis.call('HGET', KEYS[1], 'requeued') then
  redis.call('HDEL', KEYS[1], 'requeued')
  local attempt = tonumber(redis.call('HGET', KEYS[1], 'attempts')) + 1
  take(attempt)
  return {'resumed', request, created, attempt, redis.call('XRANGE', KEYS[2], '-', '+')}
end
if status ~= 'queued' then return {'refused', status or 'missing'} end
if string.find(request, '"deadline":', 1, true) then
  local deadline = cjson.decode(request)['deadline']
  if type(deadline) == 'number' and deadline <= tonumber(ARGV[4]) then
    redis.call('HSET', KEYS[1], 'status', 'failed', 'finished_at', ARGV[4], 'error', ARGV[7],
               'token_count', 0, 'usage', '{"prompt_tokens":0,"completion_tokens":0}')
    redis.call('XADD', KEYS[2], 'MAXLEN', '~', ARGV[8], '*', 'type', 'error', 'data', ARGV[6])
    redis.call('ZREM', KEYS[4], ARGV[1])
    redis.call('DEL', KEYS[7])
    expire_job(ARGV[10])
    return {'expired'}
  end
end
redis.call('HSET', KEYS[1], 'status', 'running', 'started_at', ARGV[4])
redis.call('XADD', KEYS[2], 'MAXLEN', '~', ARGV[8], '*', 'type', 'status', 'data', ARGV[5])
take(1)
return {'running', request, created}
"""
)

# KEYS: record, stream, cancel, lease, running ; ARGV: id, worker, final state, maxlen, retention,
# number of events n, then n (type, data) pairs with the terminal event last, then field/value
# pairs for the record. A job that is no longer running is left as it is, and so is one whose
# lease this worker no longer holds ('lost': another worker resumes it): nothing is appended.
FINISH_LUA = (
    EXPIRE_JOB_LUA
    + """
local status = redis.call('HGET', KEYS[1], 'status')
if status ~= 'running' then return status or 'missing' end
if redis.call('GET', KEYS[4]) ~= ARGV[2] then return 'lost' end
local events = tonumber(ARGV[6])
for i = 0, events - 1 do
  redis.call('XADD', KEYS[2], 'MAXLEN', '~', ARGV[4], '*', 'type', ARGV[7 + 2 * i], 'data', ARGV[8 + 2 * i])
end
redis.call('HSET', KEYS[1], 'status', ARGV[3], unpack(ARGV, 7 + 2 * events))
redis.call('DEL', KEYS[4])
redis.call('SREM', KEYS[5], ARGV[1])
expire_job(ARGV[5])
return ARGV[3]
"""
)

# KEYS: record, stream, cancel, queue, arq job ; ARGV: id, now, cancelled event, maxlen, retention, lifetime
# The cancel key of a running job holds when the first cancel was asked for (for the cancel latency).
CANCEL_LUA = (
    EXPIRE_JOB_LUA
    + """
local status = redis.call('HGET', KEYS[1], 'status')
if not status then return 'missing' end
if status == 'queued' then
  redis.call('HSET', KEYS[1], 'status', 'cancelled', 'finished_at', ARGV[2], 'token_count', 0,
             'usage', '{"prompt_tokens":0,"completion_tokens":0}')
  redis.call('XADD', KEYS[2], 'MAXLEN', '~', ARGV[4], '*', 'type', 'cancelled', 'data', ARGV[3])
  redis.call('ZREM', KEYS[4], ARGV[1])
  redis.call('DEL', KEYS[5])
  expire_job(ARGV[5])
  return 'cancelled_queued'
end
if status == 'running' then
  redis.call('SET', KEYS[3], ARGV[2], 'EX', ARGV[6], 'NX')
end
return status
"""
)


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


@dataclass(frozen=True)
class Started:
    """A job a worker has taken: what to generate, which run of the job this is, and where it stands."""

    request: JobRequest
    attempt: int
    progress: Progress
    submitted_at: float  # epoch seconds, the record's `created_at`

    @property
    def resumed(self) -> bool:
        """Another worker ran the job before and handed it back (or lost it) midway."""
        return self.attempt > 1


@dataclass(frozen=True)
class Outcome:
    """How a running job ended, as the record keeps it."""

    state: JobState
    text: str
    token_count: int
    usage: Usage
    finish_reason: str | None = None
    error: str | None = None

    def record_fields(self, finished_at: float) -> list[str]:
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
        return [str(item) for pair in fields.items() for item in pair]


class JobStore:
    """Creates, starts, cancels, finishes and reads job records."""

    def __init__(self, redis: aioredis.Redis, keys: Keys, settings: Settings) -> None:
        self.redis = redis
        self.keys = keys
        self.settings = settings
        self._submit = redis.register_script(SUBMIT_LUA)
        self._start = redis.register_script(START_LUA)
        self._cancel = redis.register_script(CANCEL_LUA)

    async def submit(
        self, request: JobRequest, idempotency_key: str | None = None, owner: str = ANONYMOUS_OWNER
    ) -> Submission:
        """Write record (with its owner), `queued` event and arq job in one atomic round trip.

        An idempotency key is the owner's own: another owner's same key makes another job.
        """
        job_id = uuid.uuid4().hex
        now = time.time()
        queued = StatusEvent(seq=0, state=JobState.queued).model_dump_json()
        payload = serialize_job(ARQ_FUNCTION, (job_id,), {}, None, int(now * 1000))
        keys = [
            self.keys.job(job_id),
            self.keys.stream(job_id),
            self.keys.idempotency(idempotency_key, owner) if idempotency_key else "",
            self.keys.queue,
            self.keys.arq_job(job_id),
        ]
        args: list[Any] = [
            job_id,
            repr(now),
            request.model_dump_json(exclude_none=True),
            queued,
            payload,
            self.settings.job_lifetime_seconds,
            self.settings.max_queued_jobs,
            self.settings.stream_maxlen,
            int(now * 1000),
            owner,
            self.keys.queue_wakeup,
        ]
        with redis_errors():
            verdict, *values = await self._submit(keys=keys, args=args)
        if verdict == "overloaded":
            raise Overloaded(
                f"the queue holds {values[0]} jobs, its limit is {self.settings.max_queued_jobs}"
            )
        if verdict == "created":
            job_id, status, created_at = values
            return Submission(job_id, True, JobState(status), _timestamp(created_at))
        # Replayed: the job an earlier request with this key made.
        job_id = values[0]
        with redis_errors():
            status, created_at = await self.redis.hmget(self.keys.job(job_id), ["status", "created_at"])  # type: ignore[misc]
        if status is None:
            raise JobNotFound(f"job {job_id} of this idempotency key has expired")
        return Submission(job_id, False, JobState(status), _timestamp(created_at))

    async def start(self, job_id: str, worker_id: str, model: str) -> Started | None:
        """Take a queued job, or resume a handed-back one, under this worker's lease.

        None when there is nothing to run: the job was cancelled, another worker holds it, or
        its deadline passed while it was queued (then it has failed with `deadline_exceeded`).
        """
        now = time.time()
        running = StatusEvent(seq=1, state=JobState.running, attempt=1).model_dump_json()
        expired = ErrorEvent(seq=1, message=DEADLINE_PASSED, code=DEADLINE_EXCEEDED).model_dump_json()
        keys = [
            *self.keys.job_keys(job_id),
            self.keys.queue,
            self.keys.lease(job_id),
            self.keys.running,
            self.keys.arq_job(job_id),
        ]
        lease_ms = int(self.settings.lease_seconds * 1000)
        args: list[str | int] = [job_id, worker_id, model, repr(now), running, expired, DEADLINE_PASSED]
        args += [self.settings.stream_maxlen, lease_ms, self.settings.retention_seconds]
        with redis_errors():
            verdict, *values = await self._start(keys=keys, args=args)
        if verdict == "running":
            request, created_at = values
            return Started(
                JobRequest.model_validate_json(request), 1, Progress(FIRST_WORKER_SEQ), float(created_at)
            )
        if verdict == "resumed":
            request, created_at, attempt, entries = values
            events = _events(dict(zip(fields[::2], fields[1::2], strict=True)) for _, fields in entries)
            progress = Progress.of(events)
            return Started(JobRequest.model_validate_json(request), int(attempt), progress, float(created_at))
        return None

    def finish_command(
        self, job_id: str, worker_id: str, events: list[Event], outcome: Outcome
    ) -> tuple[Any, ...]:
        """An EVAL that appends the last events (terminal last) and ends a running job, atomically,
        if this worker still holds its lease."""
        keys = [*self.keys.job_keys(job_id), self.keys.lease(job_id), self.keys.running]
        args = [
            job_id,
            worker_id,
            outcome.state.value,
            self.settings.stream_maxlen,
            self.settings.retention_seconds,
            len(events),
            *(part for event in events for part in (event.type, event.model_dump_json())),
            *outcome.record_fields(time.time()),
        ]
        return (FINISH_LUA, len(keys), *keys, *args)

    async def cancel(self, job_id: str) -> tuple[CancelAnswer, bool]:
        """Cancel a queued job at once, or ask the worker of a running one to stop; idempotent.

        Also answers whether the cancel took effect (False: the job had already ended).
        """
        event = CancelledEvent(seq=1, usage=Usage(prompt_tokens=0, completion_tokens=0)).model_dump_json()
        keys = [*self.keys.job_keys(job_id), self.keys.queue, self.keys.arq_job(job_id)]
        args: list[str | int] = [
            job_id,
            repr(time.time()),
            event,
            self.settings.stream_maxlen,
            self.settings.retention_seconds,
            self.settings.job_lifetime_seconds,
        ]
        with redis_errors():
            verdict = await self._cancel(keys=keys, args=args)
        if verdict == "missing":
            raise JobNotFound(f"no job {job_id}")
        if verdict == "cancelled_queued":
            return CancelAnswer(id=job_id, status=JobState.cancelled, message="cancelled before it ran"), True
        state = JobState(verdict)
        if state is JobState.running:
            message = "cancel requested; the stream ends with 'cancelled'"
            return CancelAnswer(id=job_id, status=state, message=message), True
        return CancelAnswer(
            id=job_id, status=state, message=f"job already {state.value}; nothing changed"
        ), False

    async def check_owner(self, job_id: str, owner: str) -> None:
        """`JobNotFound` unless the job exists and is `owner`'s: another owner cannot tell it exists."""
        with redis_errors():
            recorded = await self.redis.hget(self.keys.job(job_id), "owner")  # type: ignore[misc]
        if recorded != owner:
            raise JobNotFound(f"no job {job_id}")

    async def status(self, job_id: str) -> JobState:
        with redis_errors():
            state = await self.redis.hget(self.keys.job(job_id), "status")  # type: ignore[misc]
        if state is None:
            raise JobNotFound(f"no job {job_id}")
        return JobState(state)

    async def record(self, job_id: str) -> JobRecord:
        """The job record; while the job runs its output so far is read from its stream."""
        with redis_errors():
            async with self.redis.pipeline(transaction=False) as pipe:
                pipe.hgetall(self.keys.job(job_id))
                pipe.zrank(self.keys.queue, job_id)
                fields, rank = await pipe.execute()
        if not fields:
            raise JobNotFound(f"no job {job_id}")
        state = JobState(fields["status"])
        if state.terminal:
            output = JobOutput(text=fields.get("text", ""), token_count=int(fields.get("token_count", 0)))
        else:
            output = await self._output_so_far(job_id)
        return JobRecord(
            id=job_id,
            status=state,
            model=fields.get("model"),
            worker=fields.get("worker"),
            created_at=_timestamp(fields["created_at"]),
            started_at=_optional_timestamp(fields.get("started_at")),
            finished_at=_optional_timestamp(fields.get("finished_at")),
            output=output,
            finish_reason=fields.get("finish_reason"),
            usage=Usage.model_validate_json(fields["usage"]) if "usage" in fields else None,
            error=fields.get("error"),
            queue_position=rank if state is JobState.queued else None,
            attempts=int(fields.get("attempts", 0)),
        )

    async def _output_so_far(self, job_id: str) -> JobOutput:
        with redis_errors():
            entries = await self.redis.xrange(self.keys.stream(job_id))
        progress = Progress.of(_events(fields for _, fields in entries))
        return JobOutput(text=progress.text, token_count=len(progress.token_ids))
