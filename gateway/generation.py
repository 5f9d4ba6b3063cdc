"""Running a job for a route that answers in another API's shape (OpenAI, TGI).

Such routes go through the same queue, streams and cancel keys as the native API:
they submit a job, read its events from the start, and cancel it when their client
goes away before the end.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator
from dataclasses import dataclass, field

from fastapi import Request

from gateway.deps import Services
from gateway.relay import START
from shared.errors import EngineError, Overloaded, PromptTooLong, StreampoolError
from shared.events import (
    CancelledEvent,
    DeltaEvent,
    DoneEvent,
    ErrorEvent,
    Event,
    TokenLogprob,
    Usage,
    event_adapter,
)
from shared.requests import JobRequest

DISCONNECT_POLL_SECONDS = 0.5
JOB_ID_HEADER = "X-Streampool-Job-Id"  # names the job behind an answer that streams it or waits for it


class JobCancelled(StreampoolError):
    error_type = "cancelled"


def error_from_event(event: ErrorEvent) -> StreampoolError:
    """The exception a failed job's `error` event stands for."""
    if event.code == PromptTooLong.error_type:
        return PromptTooLong(event.message)
    return EngineError(event.message, code=event.code)


def raise_for_failure(event: Event) -> None:
    """Raise what an `error` or `cancelled` event means for a client waiting on the output."""
    if isinstance(event, ErrorEvent):
        raise error_from_event(event)
    if isinstance(event, CancelledEvent):
        raise JobCancelled("the job was cancelled")


@dataclass
class Result:
    """A whole generation, for routes that answer once at the end."""

    text: str = ""
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[TokenLogprob] = field(default_factory=list)
    finish_reason: str = "stop"
    usage: Usage = field(default_factory=lambda: Usage(prompt_tokens=0, completion_tokens=0))


class JobRun:
    """One submitted job, read from its first event; leaving early cancels it."""

    def __init__(self, services: Services, job_id: str) -> None:
        self.services = services
        self.job_id = job_id
        self.ended = False

    @classmethod
    async def submit(cls, services: Services, request: JobRequest, owner: str) -> JobRun:
        """Queue the job now, so that refusals (429, 503) still become plain HTTP errors."""
        try:
            submission = await services.store.submit(request, owner=owner)
        except Overloaded:
            services.metrics.jobs_rejected.labels(reason="overloaded").inc()
            raise
        services.metrics.jobs_submitted.inc()
        return cls(services, submission.job_id)

    async def events(self) -> AsyncGenerator[Event, None]:
        """Every event of the job up to its terminal one; a client gone before that cancels the job."""
        try:
            async for entry in self.services.relay.follow(self.job_id, START):
                if entry.terminal:
                    self.ended = True
                yield event_adapter.validate_json(entry.data)
        finally:
            if not self.ended:
                await asyncio.shield(self.cancel())

    async def cancel(self) -> None:
        self.ended = True
        await self.services.store.cancel(self.job_id)

    async def result(self, request: Request) -> Result:
        """The whole output; raises the job's error, and cancels the job if the client disconnects."""
        collecting = asyncio.ensure_future(self._collect())
        while not collecting.done():
            await asyncio.wait({collecting}, timeout=DISCONNECT_POLL_SECONDS)
            if not collecting.done() and await request.is_disconnected():
                collecting.cancel()
                await asyncio.shield(self.cancel())
                raise JobCancelled("the client disconnected")
        return collecting.result()

    async def _collect(self) -> Result:
        result = Result()
        texts: list[str] = []
        async for event in self.events():
            if isinstance(event, DeltaEvent):
                texts.append(event.text)
                result.token_ids.extend(event.token_ids)
                result.logprobs.extend(event.logprobs or [])
            elif isinstance(event, DoneEvent):
                result.finish_reason, result.usage = event.finish_reason, event.usage
            raise_for_failure(event)
        result.text = "".join(texts)
        return result
