"""OpenAI's Response objects and Responses stream events, from a job's record and events. Pure, no I/O.

Shapes are those of `openai.types.responses`, and those of the Open Responses specification (its
`ResponseResource` and streamed events) where the `openai` package leaves a field out or optional: a
Response reports the sampling values and tools its job used, and what does not apply (the service
tier) with the specification's values. A response is one job (`resp_<job id>`); its output items
are made as vLLM's Responses server makes them from a parsed output: the model's reasoning (a
`reasoning` item, `rs_<job id>`), its text (a `message`, `msg_<job id>`, of one `output_text` part),
and one `function_call` item per tool call (`fc_<job id>_<the call's index>`, its `call_id` the
call's id); none of them where the output has none of it.

Streamed, as vLLM streams them (`SimpleStreamingEventProcessor`): an item is added when the first
delta of its kind comes, and done when a delta of another kind (or another call) comes or the job
ends, so that items follow one another; within one job event the reasoning goes first, then the
text, then the calls by index. The events of an item::

    reasoning       response.output_item.added, response.content_part.added (reasoning_text),
                    response.reasoning.delta..., response.reasoning.done, response.content_part.done,
                    response.output_item.done
    message         response.output_item.added, response.content_part.added (output_text),
                    response.output_text.delta..., response.output_text.done,
                    response.content_part.done, response.output_item.done
    function_call   response.output_item.added, response.function_call_arguments.delta...,
                    response.function_call_arguments.done, response.output_item.done

The reasoning events have the Open Responses specification's names (`response.reasoning.delta`);
OpenAI's and vLLM's name them `response.reasoning_text.delta`, which the specification has no event
of. A streamed Response holds its items in the order they were streamed; one answered whole or read
back holds them in vLLM's order for a whole answer (reasoning, message, calls), the same items but
where a model wrote text after a call.

Lifecycle events: `response.created` and `response.queued` (the job's `queued` event),
`response.in_progress` (each `running` event: a resumed run's too), then the end: response.completed,
response.incomplete (cut by max_output_tokens), response.cancelled or response.failed.

Sequence numbers are counted over the job's stream from its first event, which every reader reads
(the relay reads the stream from its start: catch-up reads of about `reader_batch_bytes`), so that
every gateway, and every resume, numbers the same event the same way; `starting_after=N` sends the
events numbered past N. The done events carry the whole text, which the deltas before N hold.

OpenAI's stream types have no event for a cancelled response; its stream ends with
`response.cancelled` (the name OpenAI gives that end in its webhooks), the Response in status
`cancelled`: the `openai` package passes it on as an event of that type.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from gateway.compat.responses_bodies import Stored
from shared.chat import ToolCall
from shared.events import (
    CancelledEvent,
    DeltaEvent,
    DoneEvent,
    ErrorEvent,
    Event,
    JobState,
    StatusEvent,
    TokenLogprob,
    ToolCallDelta,
    Usage,
)
from shared.requests import JobRecord

RESPONSE_PREFIX = "resp_"
ENDS = {
    "completed": "response.completed",
    "incomplete": "response.incomplete",
    "cancelled": "response.cancelled",
    "failed": "response.failed",
}
STATUSES = {
    JobState.queued: "queued",
    JobState.running: "in_progress",
    JobState.completed: "completed",
    JobState.cancelled: "cancelled",
    JobState.failed: "failed",
}
CUT = "length"  # the finish reason of a job max_tokens stopped
ItemKind = Literal["reasoning", "message", "function_call"]
ITEM_PREFIXES: dict[ItemKind, str] = {"reasoning": "rs", "message": "msg", "function_call": "fc"}


def status_of(state: JobState, finish_reason: str | None) -> str:
    """The Response's status for a job's state."""
    if state is JobState.completed and finish_reason == CUT:
        return "incomplete"
    return STATUSES[state]


def usage_object(usage: Usage) -> dict[str, Any]:
    return {
        "input_tokens": usage.prompt_tokens,
        "input_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0},
        "output_tokens": usage.completion_tokens,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": usage.total_tokens,
    }


def logprob_object(logprob: TokenLogprob, top: int) -> dict[str, Any]:
    """A token's logprob as an output text's (`include: message.output_text.logprobs`), with `top` of
    its alternatives, as vLLM gives them (a logprob at least -9999, the token's UTF-8 bytes)."""

    def entry(token: str, value: float) -> dict[str, Any]:
        return {"token": token, "logprob": max(value, -9999.0), "bytes": list(token.encode())}

    alternatives = [entry(alt.token, alt.logprob) for alt in logprob.top_logprobs[:top]]
    return entry(logprob.token, logprob.logprob) | {"top_logprobs": alternatives}


def item_id(job_id: str, kind: ItemKind, suffix: int | None = None) -> str:
    """An output item's id: the job's, after its kind's prefix, and `suffix` (a call's index, or the
    place of a second item of a kind) if any."""
    base = f"{ITEM_PREFIXES[kind]}_{job_id}"
    return base if suffix is None else f"{base}_{suffix}"


@dataclass(frozen=True)
class Head:
    """What every Response object of one response carries, fixed at its creation."""

    job_id: str
    created_at: float
    stored: Stored

    @property
    def id(self) -> str:
        return RESPONSE_PREFIX + self.job_id


@dataclass
class Item:
    """One output item as it stands: its text (a message's, the reasoning, or a call's arguments) and,
    for a call, its `call_id` and name; `closed`: the status it was closed in, once it is."""

    kind: ItemKind
    id: str
    text: str = ""
    logprobs: list[dict[str, Any]] = field(default_factory=list)
    call_id: str = ""
    name: str = ""
    closed: str | None = None

    def status(self, response_status: str) -> str:
        """As OpenAI gives an item's: the status it was closed in, else in progress while the response
        is, completed in a response that completed, incomplete in one that ended otherwise."""
        if self.closed is not None:
            return self.closed
        if response_status in ("queued", "in_progress", "completed"):
            return "completed" if response_status == "completed" else "in_progress"
        return "incomplete"

    def part(self) -> dict[str, Any]:
        """Its content part (a message's or the reasoning's)."""
        if self.kind == "reasoning":
            return {"type": "reasoning_text", "text": self.text}
        return {"type": "output_text", "text": self.text, "annotations": [], "logprobs": self.logprobs}

    def object(self, status: str) -> dict[str, Any]:
        """The item as a Response's `output` holds it, in `status`."""
        if self.kind == "function_call":
            return {
                "id": self.id,
                "type": "function_call",
                "call_id": self.call_id,
                "name": self.name,
                "arguments": self.text,
                "status": status,
            }
        if self.kind == "reasoning":
            return {
                "id": self.id,
                "type": "reasoning",
                "summary": [],
                "content": [self.part()],
                "status": status,
            }
        return {
            "id": self.id,
            "type": "message",
            "role": "assistant",
            "status": status,
            "content": [self.part()],
        }

    def added(self) -> dict[str, Any]:
        """The item as `response.output_item.added` gives it: nothing in it yet."""
        item = self.object("in_progress")
        if self.kind != "function_call":
            item["content"] = []
        return item


def whole_items(
    job_id: str,
    text: str,
    reasoning: str | None = None,
    calls: list[ToolCall] | None = None,
    logprobs: list[dict[str, Any]] | None = None,
) -> list[Item]:
    """The items of an output answered whole, as vLLM's `build_response_output_items` makes them:
    the reasoning, the text and each call, where there are; an output of none of them is an empty
    message, as vLLM's whole answer of a pool that parses nothing."""
    items = []
    if reasoning:
        items.append(Item("reasoning", item_id(job_id, "reasoning"), reasoning))
    if text:
        items.append(Item("message", item_id(job_id, "message"), text, logprobs or []))
    for index, call in enumerate(calls or []):
        name, arguments = call.function.name, call.function.arguments
        items.append(
            Item("function_call", item_id(job_id, "function_call", index), arguments, [], call.id, name)
        )
    return items or [Item("message", item_id(job_id, "message"), "", logprobs or [])]


@dataclass(frozen=True)
class Standing:
    """Where a response stands: its status, its output items (None: it has none, not having run) and
    usage."""

    status: str
    output: list[Item] | None = None
    usage: Usage | None = None
    error: str | None = None
    completed_at: float | None = None

    @classmethod
    def of_record(cls, record: JobRecord, logprobs: list[dict[str, Any]] | None = None) -> Standing:
        """From the job record: the output so far once it has started (`logprobs`: its text's, which
        only the job's events hold), the end's usage and error."""
        status = status_of(record.status, record.finish_reason)
        output = record.output
        return cls(
            status=status,
            output=whole_items(record.id, output.text, output.reasoning, output.tool_calls, logprobs)
            if record.started_at is not None
            else None,
            usage=record.usage,
            error=record.error if status == "failed" else None,
            completed_at=record.finished_at.timestamp()
            if record.finished_at and status == "completed"
            else None,
        )


def response_object(head: Head, standing: Standing) -> dict[str, Any]:
    """The Response, as `openai.types.responses.Response` and Open Responses' `ResponseResource`."""
    stored = head.stored
    return {
        "id": head.id,
        "object": "response",
        "created_at": int(head.created_at),
        "status": standing.status,
        "background": stored.background,
        "store": stored.store,
        "model": stored.model,
        "instructions": stored.instructions,
        "metadata": stored.metadata,
        "previous_response_id": stored.previous_response_id,
        "temperature": stored.temperature,
        "top_p": stored.top_p,
        "presence_penalty": stored.presence_penalty,
        "frequency_penalty": stored.frequency_penalty,
        "top_logprobs": stored.top_logprobs,
        "max_output_tokens": stored.max_output_tokens,
        "text": stored.text,
        "tools": stored.tools,
        "tool_choice": stored.tool_choice,
        "parallel_tool_calls": stored.parallel_tool_calls,
        "max_tool_calls": None,
        "reasoning": stored.reasoning,
        "truncation": stored.truncation,
        "service_tier": "default",
        "safety_identifier": stored.safety_identifier,
        "prompt_cache_key": stored.prompt_cache_key,
        "output": [item.object(item.status(standing.status)) for item in standing.output or []],
        "usage": None if standing.usage is None else usage_object(standing.usage),
        "error": None if standing.error is None else {"code": "server_error", "message": standing.error},
        "incomplete_details": {"reason": "max_output_tokens"} if standing.status == "incomplete" else None,
        "completed_at": None if standing.completed_at is None else int(standing.completed_at),
    }


def error_event(message: str, code: str, sequence_number: int) -> dict[str, Any]:
    """A stream that fails on the gateway's side (not the job's end) ends with this."""
    return {
        "type": "error",
        "code": code,
        "message": message,
        "param": None,
        "sequence_number": sequence_number,
    }


@dataclass
class ResponseEvents:
    """Turns one job's events, in order from its first, into the response's stream events."""

    head: Head
    items: list[Item] = field(default_factory=list)
    number: int = 0  # the next event's sequence number
    open: Item | None = None  # the item deltas go to
    call_index: int | None = None  # the job's index of the call `open` is
    ran: bool = False  # a run began: the response has an output (none where it never ran)

    def _event(self, kind: str, **fields: Any) -> dict[str, Any]:
        event = {"type": kind, "sequence_number": self.number, **fields}
        self.number += 1
        return event

    def _lifecycle(self, kind: str, status: str) -> dict[str, Any]:
        return self._event(kind, response=response_object(self.head, Standing(status, self.items)))

    def _place(self, item: Item) -> dict[str, Any]:
        return {"item_id": item.id, "output_index": self.items.index(item)}

    def feed(self, event: Event, at: float) -> list[dict[str, Any]]:
        """The response events of `event`; `at`: when it was written (epoch seconds)."""
        if isinstance(event, StatusEvent):
            return self._status(event)
        if isinstance(event, DeltaEvent):
            return self._delta(event) if event.index == 0 else []  # a response is one choice
        return self._end(event, at)

    def _status(self, event: StatusEvent) -> list[dict[str, Any]]:
        if event.state is JobState.queued:
            return [
                self._lifecycle("response.created", "queued"),
                self._lifecycle("response.queued", "queued"),
            ]
        if event.state is not JobState.running:
            return []
        self.ran = True
        return [self._lifecycle("response.in_progress", "in_progress")]

    def _delta(self, event: DeltaEvent) -> list[dict[str, Any]]:
        """Reasoning, then text, then each call's parts, as vLLM's `split_delta` orders them."""
        out = []
        if event.reasoning:
            out += self._switch("reasoning")
            out += self._add_reasoning(event.reasoning)
        if event.text:
            out += self._switch("message")
            out += self._add_text(event.text, event.logprobs or [])
        for part in event.tool_calls or []:
            out += self._switch("function_call", part)
            out += self._add_arguments(part.function.arguments)
        return out

    def _switch(self, kind: ItemKind, part: ToolCallDelta | None = None) -> list[dict[str, Any]]:
        """The events that close the open item and open one of `kind` (a call: the one `part` is of),
        unless that is the one open."""
        index = None if part is None else part.index
        if self.open is not None and self.open.kind == kind and self.call_index == index:
            return []
        out = self._close("completed")
        place = len(self.items)
        if part is not None:
            call_id = part.id or f"call_{part.index}"  # as `shared.events.whole_calls` names it
            item = Item(
                kind, item_id(self.head.job_id, kind, index), call_id=call_id, name=part.function.name or ""
            )
        else:
            first = all(other.kind != kind for other in self.items)
            item = Item(kind, item_id(self.head.job_id, kind, None if first else place))
        self.items.append(item)
        self.open, self.call_index = item, index
        out.append(self._event("response.output_item.added", output_index=place, item=item.added()))
        if part is None:
            place_of = self._place(item)
            out.append(
                self._event("response.content_part.added", **place_of, content_index=0, part=item.part())
            )
        return out

    def _add_reasoning(self, text: str) -> list[dict[str, Any]]:
        item = self._opened()
        item.text += text
        return [self._event("response.reasoning.delta", **self._place(item), content_index=0, delta=text)]

    def _add_text(self, text: str, logprobs: list[TokenLogprob]) -> list[dict[str, Any]]:
        item = self._opened()
        item.text += text
        stored = self.head.stored
        given = (
            [logprob_object(logprob, stored.top_logprobs) for logprob in logprobs]
            if stored.output_logprobs
            else []
        )
        item.logprobs += given
        return [
            self._event(
                "response.output_text.delta", **self._place(item), content_index=0, delta=text, logprobs=given
            )
        ]

    def _add_arguments(self, arguments: str) -> list[dict[str, Any]]:
        item = self._opened()
        if not arguments:
            return []
        item.text += arguments
        return [self._event("response.function_call_arguments.delta", **self._place(item), delta=arguments)]

    def _opened(self) -> Item:
        assert self.open is not None  # `_to` opened it
        return self.open

    def _close(self, status: str) -> list[dict[str, Any]]:
        """The events that close the open item, if any, in `status`."""
        item = self.open
        if item is None:
            return []
        self.open, self.call_index = None, None
        place = self._place(item)
        if item.kind == "function_call":
            out = [
                self._event(
                    "response.function_call_arguments.done", **place, arguments=item.text, name=item.name
                )
            ]
        else:
            done = "response.reasoning.done" if item.kind == "reasoning" else "response.output_text.done"
            text = {"text": item.text} | ({} if item.kind == "reasoning" else {"logprobs": item.logprobs})
            out = [
                self._event(done, **place, content_index=0, **text),
                self._event("response.content_part.done", **place, content_index=0, part=item.part()),
            ]
        item.closed = status
        out.append(
            self._event(
                "response.output_item.done", output_index=place["output_index"], item=item.object(status)
            )
        )
        return out

    def _end(self, event: Event, at: float) -> list[dict[str, Any]]:
        output = self.items if self.ran else None
        if isinstance(event, DoneEvent):
            status = "incomplete" if event.finish_reason == CUT else "completed"
            standing = Standing(
                status, output, event.usage, completed_at=at if status == "completed" else None
            )
        elif isinstance(event, CancelledEvent):
            standing = Standing("cancelled", output, event.usage)
        else:
            assert isinstance(event, ErrorEvent)  # the last kind of event
            standing = Standing("failed", output, error=event.message)
        events = self._close("completed" if standing.status == "completed" else "incomplete")
        final = self._event(ENDS[standing.status], response=response_object(self.head, standing))
        return [*events, final]


def deleted(job_id: str) -> dict[str, Any]:
    return {"id": RESPONSE_PREFIX + job_id, "object": "response", "deleted": True}
