"""Running a job for a route that answers in another API's shape (OpenAI, TGI).

Such routes go through the same admission, queue, streams and cancel keys as the native
API: once their job is admitted, they read its events from the start, and cancel it when
their client goes away before the end, unless the run is kept (`keep_running`: a stored chat
completion, or one its client asked to keep), whose job goes on to its end for a client to resume
(`gateway.resumption`). Their clients cannot resume elsewhere, so a stopping gateway lets these runs
go on (`OpenRuns`) where it ends native event streams at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Iterator
from contextlib import aclosing, contextmanager
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from typing import Any, Protocol

from fastapi import Request
from sse_starlette import EventSourceResponse, ServerSentEvent
from starlette.types import Receive, Scope, Send

from gateway.compat.openai_answers import (
    Answer,
    CalledFunctionObject,
    ChoiceOutput,
    PromptEcho,
    ToolCallObject,
    completion,
)
from gateway.deps import Services
from gateway.relay.cursors import START
from gateway.relay.entries import Entry
from gateway.relay.following import Following
from gateway.relay.open_streams import Hold
from gateway.relay.streamed_answer import streamed_answer
from shared.chat import ToolCall
from shared.errors import (
    BackendUnavailable,
    DeadlineExceeded,
    EngineError,
    JobCancelled,
    PromptTooLong,
    StreampoolError,
)
from shared.events import (
    CancelledEvent,
    DeltaEvent,
    DoneEvent,
    Echo,
    ErrorEvent,
    Event,
    TokenLogprob,
    ToolCallDelta,
    Usage,
    event_adapter,
    whole_calls,
)
from shared.requests import JobRequest

DISCONNECT_POLL_SECONDS = 0.5
JOB_ID_HEADER = "X-Streampool-Job-Id"  # names the job behind an answer that streams it or waits for it


def error_from_event(event: ErrorEvent) -> StreampoolError:
    """The exception a failed job's `error` event stands for."""
    if event.code == PromptTooLong.error_type:
        return PromptTooLong(event.message)
    if event.code == DeadlineExceeded.error_type:
        return DeadlineExceeded(event.message)
    return EngineError(event.message, code=event.code)


def raise_for_failure(event: Event) -> None:
    """Raise what an `error` or `cancelled` event means for a client waiting on the output."""
    if isinstance(event, ErrorEvent):
        raise error_from_event(event)
    if isinstance(event, CancelledEvent):
        raise JobCancelled("the job was cancelled")


@dataclass
class Choice:
    """One choice of a whole generation: its content, and where the pool parses output, its reasoning
    and tool calls."""

    text: str = ""
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[TokenLogprob] = field(default_factory=list)
    finish_reason: str = "stop"
    stop_reason: int | str | None = None
    reasoning: str = ""
    tool_calls: list[ToolCall] = field(default_factory=list)
    prompt_logprobs: list[TokenLogprob | None] | None = None
    echo: Echo | None = None  # its prompt given back, where the job was asked to (`JobRequest.echo`)


@dataclass
class Result:
    """A whole generation, for routes that answer once at the end: its choices (one unless the job
    asked for `n`), and usage over all of them; or a pooling job's answer."""

    choices: list[Choice] = field(default_factory=list)
    usage: Usage = field(default_factory=lambda: Usage(prompt_tokens=0, completion_tokens=0))
    pooled: dict[str, Any] | None = None  # a pooling job's whole answer (`DoneEvent.result`)

    def choice(self, index: int) -> Choice:
        """The choice `index`, made when its first delta comes."""
        while len(self.choices) <= index:
            self.choices.append(Choice())
        return self.choices[index]

    @property
    def first(self) -> Choice:
        """The first choice: all that routes of one choice (TGI's) answer with."""
        return self.choice(0)


class OpenRuns:
    """The runs a gateway process is answering, so that a stopping gateway can cancel those still
    going when its grace period ends."""

    def __init__(self) -> None:
        self._runs: set[JobRun] = set()

    @contextmanager
    def open(self, run: JobRun) -> Iterator[None]:
        self._runs.add(run)
        try:
            yield
        finally:
            self._runs.discard(run)

    async def cancel_after(self, seconds: float) -> None:
        """Cancel every job still answered once `seconds` have passed. Each answer then ends with its
        job's `cancelled` event, as for a job cancelled through the native API while its client waits:
        an error chunk or status, never a silent close. A kept run's job goes on: its answer ends
        with this gateway's unavailability (`JobRun.let_go`), and its client resumes it elsewhere."""
        await asyncio.sleep(seconds)
        going = [run for run in list(self._runs) if not run.ended]
        for run in going:
            if run.keep_running:
                run.let_go()
        await asyncio.gather(*(run.cancel() for run in going if not run.keep_running))


class JobRun:
    """One submitted job, read from its first event; leaving early cancels it, unless it is kept
    running (`keep_running`)."""

    def __init__(
        self,
        services: Services,
        job_id: str,
        request: Request,
        *,
        keep_running: bool = False,
        following: Following | None = None,
    ) -> None:
        """`following`: the job's follow from its start, already checked (`Relay.open`); by default one
        made unchecked, for a job just submitted."""
        self.services = services
        self.job_id = job_id
        self.request = request
        self.keep_running = keep_running
        self.ended = False
        self._following = following

    async def entries(self) -> AsyncGenerator[Entry | None, None]:
        """Every entry of the job's stream up to its terminal one, and None after each
        `sse_ping_seconds` of silence (a streamed answer's turn for a keep-alive); a client gone before
        the end cancels the job, unless it is kept running."""
        open_runs: OpenRuns = self.request.app.state.open_runs
        following = self._following = self._following or self.services.relay.follow(self.job_id, START)
        try:
            with open_runs.open(self):
                async with aclosing(following.batches(self.services.settings.sse_ping_seconds)) as batches:
                    async for batch in batches:
                        if not batch:
                            yield None
                        for entry in batch:
                            if entry.terminal:
                                self.ended = True
                            yield entry
        finally:
            if not self.ended and not self.keep_running:
                await asyncio.shield(self.cancel())

    async def events(self) -> AsyncGenerator[Event | None, None]:
        """The events of `entries`, and its silences (None); `BackendUnavailable` once a kept run is
        let go before its end."""
        async with aclosing(self.entries()) as entries:
            async for entry in entries:
                yield None if entry is None else event_adapter.validate_json(entry.data)
        if not self.ended:
            raise BackendUnavailable(
                "this gateway is stopping before the job's end; the job goes on: "
                "resume its stream through another gateway"
            )

    def let_go(self) -> None:
        """End the answer of a kept run before its job's end (the gateway stops), leaving the job
        running."""
        if self._following is not None:
            self._following.stop()

    async def cancel(self) -> None:
        self.ended = True
        await self.services.store.cancel(self.job_id)

    async def result(self) -> Result:
        """The whole output; raises the job's error, and cancels the job if the client disconnects
        (or the answer is given up: a gateway past its grace period cuts what is left), unless it is
        kept running."""
        collecting = asyncio.ensure_future(self._collect())
        try:
            while not collecting.done():
                await asyncio.wait({collecting}, timeout=DISCONNECT_POLL_SECONDS)
                if not collecting.done() and await self.request.is_disconnected():
                    raise JobCancelled("the client disconnected")
            return collecting.result()
        finally:
            if not collecting.done():
                # Closes the job's events, which cancels the job (it has not ended); wait for that.
                collecting.cancel()
                await asyncio.wait({collecting})

    async def _collect(self) -> Result:
        collected = Collected()
        async for event in self.events():
            if event is not None:
                collected.add(event)
                raise_for_failure(event)
        return collected.result()


class Collected:
    """A whole generation assembled from its events, in order."""

    def __init__(self) -> None:
        self._result = Result()
        self._texts: dict[int, list[str]] = {}
        self._reasoning: dict[int, list[str]] = {}
        self._call_parts: dict[int, list[ToolCallDelta]] = {}

    def add(self, event: Event) -> None:
        result = self._result
        if isinstance(event, DeltaEvent):
            choice = result.choice(event.index)
            self._texts.setdefault(event.index, []).append(event.text)
            self._reasoning.setdefault(event.index, []).append(event.reasoning)
            self._call_parts.setdefault(event.index, []).extend(event.tool_calls or [])
            choice.token_ids.extend(event.token_ids)
            choice.logprobs.extend(event.logprobs or [])
            if event.prompt_logprobs is not None:
                choice.prompt_logprobs = event.prompt_logprobs
            if event.echo is not None:
                choice.echo = event.echo
        elif isinstance(event, DoneEvent):
            result.usage = event.usage
            result.pooled = event.result
            for index, reason in enumerate(event.finish_reasons or [event.finish_reason]):
                result.choice(index).finish_reason = reason
            for index, stop_reason in enumerate(event.stop_reasons or []):
                result.choice(index).stop_reason = stop_reason

    def result(self) -> Result:
        for index, parts in self._texts.items():
            choice = self._result.choice(index)
            choice.text = "".join(parts)
            choice.reasoning = "".join(self._reasoning[index])
            choice.tool_calls = whole_calls(self._call_parts[index])
        return self._result


class HeldEventSource(EventSourceResponse):
    """sse-starlette's response, holding its place among the gateway's open readers until it ends,
    however it ends (a client gone before its first event included)."""

    def __init__(self, content: AsyncIterator[ServerSentEvent], hold: Hold, **options: Any) -> None:
        super().__init__(content, **options)
        self.hold = hold

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        with self.hold:
            await super().__call__(scope, receive, send)


def keep_alive(sep: str | None = None) -> ServerSentEvent:
    """The keep-alive comment a streamed answer sends after `sse_ping_seconds` of silence, as
    sse-starlette's pings are written.

    Only after a silence, never on a clock as sse-starlette's own pings go (every 15 s, events flowing
    or not; the answers turn them off): vLLM's benchmark client strips each read it gets, so a comment
    that comes alone stays in its buffer and every event after it waits there until two come in one
    read. Mid-stream, that made a stall of seconds in every stream at once."""
    return ServerSentEvent(comment=f"ping - {datetime.now(timezone.utc)}", sep=sep)


def event_source(
    run: JobRun, content: AsyncIterator[ServerSentEvent], hold: Hold, sep: str | None = None
) -> EventSourceResponse:
    """A run's answer as Server-Sent Events, naming its job, holding its reader's place (`hold`) until
    it ends; its keep-alives are `content`'s own (`keep_alive`).

    sse-starlette ends its streams as soon as the server starts to stop; these go on until they end
    or the gateway's grace period ends (`OpenRuns.cancel_after`), so its own grace is unbounded.
    """
    return HeldEventSource(
        content,
        hold,
        headers={JOB_ID_HEADER: run.job_id},
        ping=0,
        sep=sep,
        shutdown_grace_period=math.inf,
    )


async def chunk_frames(
    run: JobRun,
    feed: Callable[[Event], list[dict[str, Any]]],
    failure: Callable[[StreampoolError], dict[str, Any]],
    sep: str,
    starting_after: int = 0,
) -> AsyncIterator[ServerSentEvent]:
    """A run's answer as `data:` chunks (`feed` makes each event's), then `[DONE]`, as OpenAI's and
    vLLM's servers stream, each line ended with `sep`; a failure ends it as the chunk `failure`
    writes, never a silent close (`streamed_answer`). `starting_after`: the number of chunks from the
    answer's first that are made but not sent (a client resuming has them), keep-alives not counted.

    The first chunk goes with the first token: a chunk sent earlier would make a client's time to
    first token the queue's. Until then only keep-alive comments go out, after each `sse_ping_seconds`
    of silence (`keep_alive`). Not one per state the job passes: vLLM's benchmark client strips each
    read it gets and keeps a comment that came alone in its buffer, where it swallows every later chunk.
    Closing this generator early (the client went away) closes the job's events, which cancels the job
    unless the run is kept.
    """

    def failed(exc: StreampoolError) -> list[ServerSentEvent]:
        return [ServerSentEvent(data=json.dumps(failure(exc)), sep=sep)]

    chunks = streamed_answer(_chunks(run, feed, sep, starting_after), failed, run.services.metrics)
    async with aclosing(chunks):
        async for chunk in chunks:
            yield chunk
    yield ServerSentEvent(data="[DONE]", sep=sep)


async def _chunks(
    run: JobRun, feed: Callable[[Event], list[dict[str, Any]]], sep: str, starting_after: int
) -> AsyncGenerator[ServerSentEvent, None]:
    """`chunk_frames`' chunks and keep-alives, a failed job's raised."""
    made = 0
    async with aclosing(run.events()) as events:
        async for event in events:
            if event is None:
                yield keep_alive(sep)
                continue
            raise_for_failure(event)
            for chunk in feed(event):
                made += 1
                if made > starting_after:
                    # Only `data:` lines, as OpenAI and vLLM stream them: no `event:` or `id:` fields.
                    yield ServerSentEvent(data=json.dumps(chunk), sep=sep)


class Answered(Protocol):
    """What a whole answer takes from the body it answers (`ChatBody`, `CompletionBody`, or what a
    stored chat completion keeps of its body)."""

    @property
    def role(self) -> str: ...

    @property
    def echoed(self) -> str: ...

    @property
    def prompt_echo(self) -> PromptEcho: ...


def whole_answer(body: Answered, job: JobRequest, answer: Answer, result: Result) -> dict[str, Any]:
    """OpenAI's answer (not streamed) to `body`, whose job `job` generated `result`: a route's, a
    batch's line's, or a stored chat completion's. A prompt's logprobs, and the prompt given back, come
    with the first delta of its first choice: each of its choices has them, as in vLLM's answer."""
    answer = replace(answer, role=body.role)
    alone = body.prompt_echo is PromptEcho.alone  # the prompt is the answer: the output is left out

    def first_of_its_prompt(index: int) -> Choice:
        return result.choices[index - index % job.n]

    choices = [
        ChoiceOutput(
            content="" if alone else _content(body.echoed, choice, job),
            logprobs=None if job.logprobs is None else [] if alone else choice.logprobs,
            finish_reason=choice.finish_reason,
            stop_reason=choice.stop_reason,
            reasoning=choice.reasoning or None,
            tool_calls=[_call_object(call, job) for call in choice.tool_calls],
            prompt_logprobs=None
            if job.prompt_logprobs is None
            else first_of_its_prompt(index).prompt_logprobs,
            echo=None if body.prompt_echo is PromptEcho.none else first_of_its_prompt(index).echo,
        )
        for index, choice in enumerate(result.choices)
    ]
    return completion(answer, choices, result.usage)


def _call_object(call: ToolCall, job: JobRequest) -> ToolCallObject:
    """A call as `message.tool_calls` holds it; under a `required` choice its arguments written anew
    from their JSON, as vLLM's whole answer writes them (its stream gives the model's own text)."""
    arguments = call.function.arguments
    if job.effective_tool_choice == "required":
        with contextlib.suppress(ValueError):
            arguments = json.dumps(json.loads(arguments), ensure_ascii=False)
    return ToolCallObject(
        id=call.id, function=CalledFunctionObject(name=call.function.name, arguments=arguments)
    )


def _content(echoed: str, choice: Choice, job: JobRequest) -> str | None:
    """A choice's content as vLLM's whole answer has it: none where only tool calls (of an `auto`
    choice) or only reasoning came, empty for a `required` or named choice's calls; an echo before it."""
    content: str | None = choice.text
    if not choice.text and (choice.reasoning or choice.tool_calls):
        content = "" if choice.tool_calls and job.effective_tool_choice != "auto" else None
    return echoed + (content or "") if echoed else content
