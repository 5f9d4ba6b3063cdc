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

from shared.events import Event
from shared.jobstore import JobStore, Outcome


@dataclass
class _Step:
    job_id: str
    events: list[Event]
    finish: tuple[Any, ...] | None
    answer: asyncio.Future[Any] = field(default_factory=lambda: asyncio.get_running_loop().create_future())


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
        *body, terminal = events
        command = self.store.finish_command(job_id, outcome, terminal.type, terminal.model_dump_json())
        return str(await self._submit(_Step(job_id, body, command)))

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
                stream = self.keys.stream(step.job_id)
                for event in step.events:
                    pipe.xadd(
                        stream,
                        {"type": event.type, "data": event.model_dump_json()},
                        maxlen=self.maxlen,
                        approximate=True,
                    )
                if step.finish is None:
                    pipe.exists(self.keys.cancel(step.job_id))
                else:
                    pipe.execute_command("EVAL", *step.finish)
            try:
                results = await pipe.execute()
            except Exception as exc:  # every waiting job learns of the failure
                for step in batch:
                    if not step.answer.done():
                        step.answer.set_exception(exc)
                continue
            finally:
                self.round_trips += 1
            position = 0
            for step in batch:
                position += len(step.events)
                if not step.answer.done():
                    step.answer.set_result(results[position])
                position += 1
