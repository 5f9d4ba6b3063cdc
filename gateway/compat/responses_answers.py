"""OpenAI's Response objects and Responses stream events, from a job's record and events. Pure, no I/O.

Shapes are those of `openai.types.responses`, and those of the Open Responses specification (its
`ResponseResource` and streamed events) where the `openai` package leaves a field out or optional: a
Response reports the sampling values its job used, and the fields that do not apply to a text model
(tools, reasoning, logprobs, the service tier) with the specification's empty values. A response is one
job (`resp_<job id>`) with one output message (`msg_<job id>`) of one `output_text` part.

Sequence numbers come from the job's stream alone, so that every gateway, and every resume, numbers
the same event the same way: each stream event (its `seq`, `shared.events`) makes a fixed number of
response events, numbered from a first number that depends on its `seq` only (`first_number`)::

    job stream event, seq k            response events, sequence_number
    status queued       k = 0          response.created 0, response.queued 1
    status running      k = 1          response.in_progress 2, response.output_item.added 3,
                                       response.content_part.added 4
    delta               k >= 2         response.output_text.delta k + 3
    status running,     k >= 2         response.in_progress k + 3 (another worker took the job over:
      resumed                          the events go on as one sequence)
    done | cancelled    k >= 2         response.output_text.done k + 3, response.content_part.done k + 4,
      | error                          response.output_item.done k + 5, then k + 6: response.completed,
                                       response.incomplete (cut by max_output_tokens),
                                       response.cancelled or response.failed
    cancelled | error   k = 1          response.cancelled or response.failed 2 (it never ran)

`starting_after=N` maps back to the stream: the events of seq k with `first_number(k)` > N, and the
later events of the one seq that made N, are those after N. The relay reads the stream from its start
(catch-up reads of about `reader_batch_bytes`) and the events up to N are not sent: the closing
events carry the whole text, which the deltas before N hold.

OpenAI's stream types have no event for a cancelled response; its stream ends with
`response.cancelled` (the name OpenAI gives that end in its webhooks), the Response in status
`cancelled`: the `openai` package passes it on as an event of that type.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from gateway.compat.responses_bodies import Stored
from shared.events import (
    CancelledEvent,
    DeltaEvent,
    DoneEvent,
    ErrorEvent,
    Event,
    JobState,
    StatusEvent,
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


def first_number(seq: int) -> int:
    """The sequence number of the first response event that the job's stream event `seq` makes."""
    return 0 if seq == 0 else 2 if seq == 1 else seq + 3


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


@dataclass(frozen=True)
class Head:
    """What every Response object of one response carries, fixed at its creation."""

    job_id: str
    created_at: float
    stored: Stored

    @property
    def id(self) -> str:
        return RESPONSE_PREFIX + self.job_id

    @property
    def item_id(self) -> str:
        return f"msg_{self.job_id}"


@dataclass(frozen=True)
class Standing:
    """Where a response stands: its status, its output (None: it has none, not having run) and usage."""

    status: str
    text: str | None = None
    usage: Usage | None = None
    error: str | None = None
    completed_at: float | None = None

    @classmethod
    def of_record(cls, record: JobRecord) -> Standing:
        """From the job record: the output so far once it has started, the end's usage and error."""
        status = status_of(record.status, record.finish_reason)
        return cls(
            status=status,
            text=record.output.text if record.started_at is not None else None,
            usage=record.usage,
            error=record.error if status == "failed" else None,
            completed_at=record.finished_at.timestamp()
            if record.finished_at and status == "completed"
            else None,
        )


def text_part(text: str) -> dict[str, Any]:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


def message_item(head: Head, text: str, status: str) -> dict[str, Any]:
    """The response's one output message; its status as OpenAI gives an item's."""
    item_status = status if status in ("in_progress", "completed") else "incomplete"
    return {
        "id": head.item_id,
        "type": "message",
        "role": "assistant",
        "status": item_status,
        "content": [text_part(text)],
    }


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
        "top_logprobs": 0,
        "max_output_tokens": stored.max_output_tokens,
        "text": stored.text,
        "tools": [],
        "tool_choice": "auto",
        "parallel_tool_calls": False,
        "max_tool_calls": None,
        "reasoning": None,
        "truncation": "disabled",
        "service_tier": "default",
        "safety_identifier": stored.safety_identifier,
        "prompt_cache_key": stored.prompt_cache_key,
        "output": [] if standing.text is None else [message_item(head, standing.text, standing.status)],
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
    parts: list[str] = field(default_factory=list)
    opened: bool = False  # the output item is out

    def _event(self, kind: str, number: int, **fields: Any) -> dict[str, Any]:
        return {"type": kind, "sequence_number": number, **fields}

    def _lifecycle(self, kind: str, number: int, status: str) -> dict[str, Any]:
        return self._event(kind, number, response=response_object(self.head, Standing(status)))

    def _place(self) -> dict[str, Any]:
        return {"item_id": self.head.item_id, "output_index": 0, "content_index": 0}

    def feed(self, event: Event, at: float) -> list[dict[str, Any]]:
        """The response events of `event`; `at`: when it was written (epoch seconds: its stream id's)."""
        number = first_number(event.seq)
        if isinstance(event, StatusEvent):
            return self._status(event, number)
        if isinstance(event, DeltaEvent):
            if event.index != 0:  # a response is one choice
                return []
            self.parts.append(event.text)
            return [
                self._event(
                    "response.output_text.delta", number, **self._place(), delta=event.text, logprobs=[]
                )
            ]
        return self._end(event, number, at)

    def _status(self, event: StatusEvent, number: int) -> list[dict[str, Any]]:
        if event.state is JobState.queued:
            return [
                self._lifecycle("response.created", number, "queued"),
                self._lifecycle("response.queued", number + 1, "queued"),
            ]
        if event.state is not JobState.running:
            return []
        in_progress = self._lifecycle("response.in_progress", number, "in_progress")
        if self.opened:  # a resumed run
            return [in_progress]
        self.opened = True
        item = message_item(self.head, "", "in_progress") | {"content": []}
        return [
            in_progress,
            self._event("response.output_item.added", number + 1, output_index=0, item=item),
            self._event("response.content_part.added", number + 2, **self._place(), part=text_part("")),
        ]

    def _end(self, event: Event, number: int, at: float) -> list[dict[str, Any]]:
        text = "".join(self.parts)
        if isinstance(event, DoneEvent):
            status = "incomplete" if event.finish_reason == CUT else "completed"
            standing = Standing(status, text, event.usage, completed_at=at if status == "completed" else None)
        elif isinstance(event, CancelledEvent):
            standing = Standing("cancelled", text if self.opened else None, event.usage)
        else:
            assert isinstance(event, ErrorEvent)  # the last kind of event
            standing = Standing("failed", text if self.opened else None, error=event.message)
        events = []
        if self.opened:
            item = message_item(self.head, text, standing.status)
            events = [
                self._event("response.output_text.done", number, **self._place(), text=text, logprobs=[]),
                self._event("response.content_part.done", number + 1, **self._place(), part=text_part(text)),
                self._event("response.output_item.done", number + 2, output_index=0, item=item),
            ]
        final = self._event(
            ENDS[standing.status], number + len(events), response=response_object(self.head, standing)
        )
        return [*events, final]


def item_list(items: list[dict[str, Any]], limit: int, ascending: bool, after: str | None) -> dict[str, Any]:
    """A page of `input_items`, OpenAI's list shape; `after` an item id (the page starts past it)."""
    ordered = items if ascending else items[::-1]
    ids = [item["id"] for item in ordered]
    start = ids.index(after) + 1 if after in ids else 0
    page = ordered[start : start + limit]
    return {
        "object": "list",
        "data": page,
        "first_id": page[0]["id"] if page else None,
        "last_id": page[-1]["id"] if page else None,
        "has_more": start + limit < len(ordered),
    }


def deleted(job_id: str) -> dict[str, Any]:
    return {"id": RESPONSE_PREFIX + job_id, "object": "response", "deleted": True}
