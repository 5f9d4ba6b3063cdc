"""The only writer of job streams: one Redis round trip per engine step, whatever the number of jobs.

Each running job hands its step (new events, plus the question "may I go on?") to the
publisher and waits. Steps that arrive while a round trip is in flight are gathered and
sent together in the next pipeline, like a group commit. A step is one script call per
job that checks the job's lease, appends the events and checks the cancel key: a worker
that lost the lease appends nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

import redis.asyncio as aioredis
from redis.exceptions import NoScriptError

from shared.events import Event
from shared.jobstore import JobStore, Outcome
from shared.redis_client import redis_errors

# KEYS: stream, cancel, lease ; ARGV: worker, maxlen, then (type, data) pairs
# A cancel answers with the cancel key's value: when the cancel was asked for.
STEP_LUA = """
if redis.call('GET', KEYS[3]) ~= ARGV[1] then return 'lost' end
for i = 3, #ARGV, 2 do
  redis.call('XADD', KEYS[1], 'MAXLEN', '~', ARGV[2], '*', 'type', ARGV[i], 'data', ARGV[i + 1])
end
local asked = redis.call('GET', KEYS[2])
if asked then return {'cancel', asked} end
return 'go'
"""
STEP_SHA = hashlib.sha1(STEP_LUA.encode()).hexdigest()


class Verdict(str, Enum):
    """What a job learns from its step."""

    go = "go"
    cancel = "cancel"  # a cancel was asked for: abort and end with `cancelled`
    lost = "lost"  # another worker holds the job now (or will): stop without writing


@dataclass
class _Step:
    """One job's share of a round trip: one script call, a step or the EVAL that ends the job."""

    command: tuple[Any, ...]
    answer: asyncio.Future[Any] = field(default_factory=lambda: asyncio.get_running_loop().create_future())


class Publisher:
    def __init__(self, redis: aioredis.Redis, store: JobStore, worker_id: str) -> None:
        self.redis = redis
        self.store = store
        self.keys = store.keys
        self.worker_id = worker_id
        self.maxlen = store.settings.stream_maxlen
        self._pending: list[_Step] = []
        self._sender: asyncio.Task[None] | None = None
        self.round_trips = 0
        self.cancels_asked_at: dict[str, float] = {}
        """When the cancel a job's step saw was asked for (epoch seconds), until the job takes it."""

    async def step(self, job_id: str, events: list[Event]) -> Verdict:
        """Append `events` to the job's stream if this worker still holds the job; may it go on?"""
        keys = (self.keys.stream(job_id), self.keys.cancel(job_id), self.keys.lease(job_id))
        pairs = (part for event in events for part in (event.type, event.model_dump_json()))
        command = ("EVALSHA", STEP_SHA, len(keys), *keys, self.worker_id, self.maxlen, *pairs)
        answer = await self._submit(_Step(command))
        if isinstance(answer, list):  # ['cancel', when it was asked for]
            with contextlib.suppress(ValueError):  # a value that is no time only goes unmeasured
                self.cancels_asked_at[job_id] = float(answer[1])
            return Verdict.cancel
        return Verdict(answer)

    async def finish(self, job_id: str, events: list[Event], outcome: Outcome) -> str:
        """Append the last events, the terminal one last, and end the job; answers the record's state,
        or `lost` when another worker holds the job now."""
        command = self.store.finish_command(job_id, self.worker_id, events, outcome)
        return str(await self._submit(_Step(("EVAL", *command))))

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
                pipe.execute_command(*step.command)
            try:
                with redis_errors():
                    results = await pipe.execute(raise_on_error=False)
            except Exception as exc:  # the round trip itself failed: every waiting job learns of it
                results = [exc] * len(batch)
            self.round_trips += 1
            unloaded = []
            for step, result in zip(batch, results, strict=True):
                if step.answer.done():  # its job stopped waiting (cancelled)
                    continue
                if isinstance(result, NoScriptError):
                    unloaded.append(step)
                elif isinstance(result, Exception):
                    step.answer.set_exception(result)
                else:
                    step.answer.set_result(result)
            if unloaded:  # Redis restarted (or flushed its scripts): load the step script, send them again
                await self._load_step_script(unloaded)

    async def _load_step_script(self, steps: list[_Step]) -> None:
        try:
            with redis_errors():
                await self.redis.script_load(STEP_LUA)
        except Exception as exc:
            for step in steps:
                step.answer.set_exception(exc)
            return
        self._pending[:0] = steps
