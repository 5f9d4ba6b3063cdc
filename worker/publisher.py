"""The only writer of job streams: one Redis round trip per engine step, whatever the number of jobs.

Each running job hands its step (new events, plus the question "was I cancelled?")
to the publisher and waits. Steps that arrive while a round trip is in flight are
gathered and sent together in the next pipeline: appends and cancel checks of all
jobs travel in one round trip, like a group commit.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

import redis.asyncio as aioredis
from redis.asyncio.client import Pipeline

from shared.events import Event
from shared.jobstore import JobStore, Outcome


@dataclass
class _Step:
    """One job's share of a round trip: appends and a cancel check, or one EVAL that ends the job."""

    job_id: str
    events: list[Event]
    finish: tuple[Any, ...] | None
    answer: asyncio.Future[Any] = field(default_factory=lambda: asyncio.get_running_loop().create_future())

    @property
    def commands(self) -> int:
        return 1 if self.finish is not None else len(self.events) + 1


class Publisher:
    def __init__(self, redis: aioredis.Redis, store: JobStore) -> None:
        self.redis = redis
        self.store = store
        self.keys = store.keys
        self.maxlen = store.settings.stream_maxlen
        self._pending: list[_Step] = []
        self._sender: asyncio.Task[None] | None = None
        self.round_trips = 0

    async def step(self, job_id: str, events: list[Event]) -> bool:
        """Append `events` to the job's stream; True when a cancel was asked for."""
        return bool(await self._submit(_Step(job_id, events, None)))

    async def finish(self, job_id: str, events: list[Event], outcome: Outcome) -> str:
        """Append the last events, the terminal one last, and end the job; answers the record's state."""
        command = self.store.finish_command(job_id, events, outcome)
        return str(await self._submit(_Step(job_id, [], command)))

    async def _submit(self, step: _Step) -> Any:
        self._pending.append(step)
        if self._sender is None or self._sender.done():
            self._sender = asyncio.create_task(self._send_pending())
        return await step.answer

    async def _send_pending(self) -> None:
        while self._pending:
            batch, self._pending = self._pending, []
            pipe = self.redis.pipeline(transaction=False)
            for step in batch:
                self._queue_commands(pipe, step)
            try:
                results = await pipe.execute(raise_on_error=False)
            except Exception as exc:  # the round trip itself failed: every waiting job learns of it
                results = [exc] * sum(step.commands for step in batch)
            self.round_trips += 1
            position = 0
            for step in batch:
                mine = results[position : position + step.commands]
                position += step.commands
                if step.answer.done():
                    continue
                failure = next((item for item in mine if isinstance(item, Exception)), None)
                if failure is not None:
                    step.answer.set_exception(failure)
                else:
                    step.answer.set_result(mine[-1])

    def _queue_commands(self, pipe: Pipeline, step: _Step) -> None:
        if step.finish is not None:
            pipe.execute_command("EVAL", *step.finish)
            return
        stream = self.keys.stream(step.job_id)
        for event in step.events:
            pipe.xadd(
                stream,
                {"type": event.type, "data": event.model_dump_json()},
                maxlen=self.maxlen,
                approximate=True,
            )
        pipe.exists(self.keys.cancel(step.job_id))
