"""Each owner's stored chat completions (`store: true`): an index of their jobs, read a page at a time,
and each one's ChatCompletion made again from its job.

The index is a sorted set per owner (`Keys.stored_chat_completions`), of job ids by submission time;
it holds ids alone, and a listing reads each job's record for its state, owner, metadata and framing.
Ids of jobs past their lifetime are trimmed as the index is listed, and those found gone (deleted, or
past their retention) are removed as they are met, so the index holds no more than the owner's jobs
that Redis holds, and lives no longer than the last of them.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from gateway.compat.stored_chat import METADATA, metadata_of
from gateway.deps import Services
from gateway.generation import Collected, whole_answer
from gateway.relay.cursors import START
from gateway.resumption import FRAMING, Framing
from shared.errors import JobNotFound
from shared.events import DoneEvent, JobState, event_adapter
from shared.jobstore import ANNOTATION
from shared.redis_client import redis_errors
from shared.requests import JobRequest

SCAN = 100
"""Index entries read a round trip while a filtered listing looks for a page."""
FIELDS = ["status", "owner", "created_at", ANNOTATION + METADATA, ANNOTATION + FRAMING]


@dataclass(frozen=True)
class StoredCompletion:
    """A stored chat completion's job, as a listing reads it."""

    job_id: str
    state: JobState
    created: int
    metadata: dict[str, str]
    framing: Framing
    """What its answer took from its request (the model as named, the role, the echo)."""


class StoredCompletions:
    """The stored chat completions of every owner."""

    def __init__(self, services: Services) -> None:
        self.services = services
        self.redis = services.redis
        self.keys = services.keys

    async def add(self, owner: str, job_id: str, created_at: float) -> None:
        """Index a stored completion's job; the index then lives a job lifetime from now."""
        index = self.keys.stored_chat_completions(owner)
        with redis_errors():
            async with self.redis.pipeline(transaction=False) as pipe:
                pipe.zadd(index, {job_id: created_at})
                pipe.expire(index, self.services.settings.job_lifetime_seconds)
                await pipe.execute()

    async def remove(self, owner: str, job_id: str) -> None:
        with redis_errors():
            await self.redis.zrem(self.keys.stored_chat_completions(owner), job_id)

    async def completed(self, owner: str, job_id: str, missing: JobNotFound) -> StoredCompletion:
        """`owner`'s stored completion of `job_id`, once its job has completed: `missing` for any
        other job, and until then (as on OpenAI, a completion is stored once it is answered)."""
        found = (await self._read([job_id], owner))[0]
        if found is None or found.state is not JobState.completed:
            raise missing
        return found

    async def page(
        self,
        owner: str,
        after: str | None,
        limit: int,
        descending: bool,
        listed: Callable[[StoredCompletion], bool],
    ) -> tuple[list[StoredCompletion], bool]:
        """Up to `limit` of `owner`'s completed stored completions past the job `after` (from the first
        where that job is not indexed), in order of submission (`descending`: newest first), those
        `listed` passes alone; and whether more follow."""
        index = self.keys.stored_chat_completions(owner)
        oldest = time.time() - self.services.settings.job_lifetime_seconds
        with redis_errors():
            async with self.redis.pipeline(transaction=False) as pipe:
                pipe.zremrangebyscore(index, "-inf", f"({oldest}")
                (pipe.zrevrank if descending else pipe.zrank)(index, after or "")
                _, rank = await pipe.execute()
        start = 0 if rank is None else rank + 1
        found: list[StoredCompletion] = []
        while len(found) <= limit:
            with redis_errors():
                job_ids = await self.redis.zrange(index, start, start + SCAN - 1, desc=descending)
            if not job_ids:
                break
            read = await self._read(job_ids, owner)
            gone = [job_id for job_id, stored in zip(job_ids, read, strict=True) if stored is None]
            if gone:
                with redis_errors():
                    await self.redis.zrem(index, *gone)
            found += [s for s in read if s is not None and s.state is JobState.completed and listed(s)]
            start += len(job_ids) - len(gone)  # the ones gone were before the next entries
        return found[:limit], len(found) > limit

    async def _read(self, job_ids: list[str], owner: str) -> list[StoredCompletion | None]:
        """Each job's fields that a listing reads, in one round trip; None for a job gone, another
        owner's, or not stored."""
        with redis_errors():
            async with self.redis.pipeline(transaction=False) as pipe:
                for job_id in job_ids:
                    pipe.hmget(self.keys.job(job_id), FIELDS)
                rows = await pipe.execute()
        read: list[StoredCompletion | None] = []
        for job_id, (status, recorded_owner, created_at, metadata, framing) in zip(
            job_ids, rows, strict=True
        ):
            kept = None if framing is None else Framing.of_annotations({FRAMING: framing})
            stored = None if metadata is None else metadata_of({METADATA: metadata})
            if status is None or recorded_owner != owner or kept is None or stored is None:
                read.append(None)
                continue
            read.append(StoredCompletion(job_id, JobState(status), int(float(created_at)), stored, kept))
        return read

    async def answers(self, stored: list[StoredCompletion]) -> list[dict[str, Any]]:
        """The completions' ChatCompletions, made from their jobs' requests and events as their answers
        were made, with their metadata; but those whose jobs are gone since they were read."""
        made = await asyncio.gather(*(self._answer(completion) for completion in stored))
        return [answer for answer in made if answer is not None]

    async def _answer(self, stored: StoredCompletion) -> dict[str, Any] | None:
        job_id = stored.job_id
        with redis_errors():
            request, entries = await asyncio.gather(
                self.redis.hget(self.keys.job(job_id), "request"),  # type: ignore[arg-type]
                self.services.relay.read(job_id, START, self.services.settings.stream_maxlen + 1),
            )
        events = [event_adapter.validate_json(entry.data) for entry in entries]
        if request is None or not events or not isinstance(events[-1], DoneEvent):
            return None  # deleted, or its retention ended, since it was read
        collected = Collected()
        for event in events:
            collected.add(event)
        job = JobRequest.model_validate_json(request)
        answer = stored.framing.answer(job_id, stored.created)
        return {**whole_answer(stored.framing, job, answer, collected.result()), "metadata": stored.metadata}
