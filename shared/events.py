"""Job events: one Redis stream entry, one SSE event, one element of a long-poll page."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from enum import Enum
from typing import Annotated, Any, Literal

from pydantic import BaseModel, Field, TypeAdapter

from shared.chat import FunctionCall, ToolCall


class JobState(str, Enum):
    queued = "queued"
    running = "running"
    completed = "completed"
    cancelled = "cancelled"
    failed = "failed"

    @property
    def terminal(self) -> bool:
        return self in (JobState.completed, JobState.cancelled, JobState.failed)


class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens


def _zero(value: int) -> bool:
    return value == 0


def _none(value: object) -> bool:
    return value is None


def _empty(value: str) -> bool:
    return not value


class TopLogprob(BaseModel):
    token_id: int
    token: str
    logprob: float


class TokenLogprob(BaseModel):
    """Log-probability of a sampled token (and its rank, 1 for the likeliest, where the engine gives it)
    and, when asked for, its most likely alternatives, likeliest first."""

    token_id: int
    token: str
    logprob: float
    rank: int | None = Field(None, exclude_if=_none)
    top_logprobs: list[TopLogprob] = []


class StatusEvent(BaseModel):
    """A state change; a `running` event with `resumed` says another worker took the job over."""

    type: Literal["status"] = "status"
    seq: int
    state: JobState
    message: str | None = None
    resumed: bool = False
    attempt: int | None = None  # on `running` events: which run of the job (1 first) starts


class FunctionDelta(BaseModel):
    """A part of a tool call's function: its name comes whole, once; its arguments in fragments of
    JSON text that add up to the whole."""

    name: str | None = Field(None, exclude_if=_none)
    arguments: str = ""


class ToolCallDelta(BaseModel):
    """A part of one tool call of a choice, in OpenAI's streamed shape: `index` numbers the choice's
    calls; a call's first part carries its `id`, `type` and the function's name."""

    index: int
    id: str | None = Field(None, exclude_if=_none)
    type: Literal["function"] | None = Field(None, exclude_if=_none)
    function: FunctionDelta


class Echo(BaseModel):
    """A prompt as a completion's `echo` gives it back (vLLM's): its text, decoded where it was given as
    token ids, and its first token's text, the one token of the prompt with no logprob (the others'
    come with `prompt_logprobs`)."""

    text: str
    first_token: str


class DeltaEvent(BaseModel):
    """New tokens of one choice; `index` (a job's choice, 0 to n-1) is left out for the first, so
    that a job of one choice streams as it always has.

    Where the worker's pool parses output (a chat with tools, a reasoning model), `text` is the
    answer's content alone, `reasoning` the model's thinking and `tool_calls` the parts of its calls,
    as vLLM's parsers split the tokens' text; `token_ids` are all the tokens, whatever they became."""

    type: Literal["delta"] = "delta"
    seq: int
    index: int = Field(0, exclude_if=_zero)
    text: str
    token_ids: list[int]
    logprobs: list[TokenLogprob] | None = None
    reasoning: str = Field("", exclude_if=_empty)
    tool_calls: list[ToolCallDelta] | None = Field(None, exclude_if=_none)
    prompt_logprobs: list[TokenLogprob | None] | None = Field(None, exclude_if=_none)
    """On the job's first delta, where the job asked for them: each prompt token's (null for the first,
    which nothing comes before), as vLLM's `prompt_logprobs`."""
    echo: Echo | None = Field(None, exclude_if=_none)
    """On the first delta of each prompt's first choice, where the job asked for it (`JobRequest.echo`):
    that prompt, given back."""


class DoneEvent(BaseModel):
    """The end of a job; usage counts the prompts and the tokens of every choice, as vLLM's.
    With several choices, `finish_reasons` holds each choice's, `finish_reason` the first one's.
    `stop_reasons`, when a stop string or stop token ended a choice, holds each choice's (vLLM's
    `stop_reason`: that string or token id; null where the end of sequence or the length ended it).
    A choice that called tools ends `tool_calls` where vLLM says so (auto and required choices).
    A pooling job's (`shared.pooling`) carries its whole answer in `result`, as vLLM's server gives it."""

    type: Literal["done"] = "done"
    seq: int
    finish_reason: str
    finish_reasons: list[str] | None = Field(None, exclude_if=_none)
    stop_reasons: list[int | str | None] | None = Field(None, exclude_if=_none)
    usage: Usage
    result: dict[str, Any] | None = Field(None, exclude_if=_none)  # a pooling job's answer, as vLLM's


class CancelledEvent(BaseModel):
    type: Literal["cancelled"] = "cancelled"
    seq: int
    usage: Usage


class ErrorEvent(BaseModel):
    type: Literal["error"] = "error"
    seq: int
    message: str
    code: str


Event = Annotated[
    StatusEvent | DeltaEvent | DoneEvent | CancelledEvent | ErrorEvent, Field(discriminator="type")
]
event_adapter: TypeAdapter[Event] = TypeAdapter(Event)

TERMINAL_EVENT_TYPES = frozenset({"done", "cancelled", "error"})


def event_json(event: Event) -> str:
    """The event's JSON as a stream entry holds it: `model_dump_json`'s, from the model's serializer
    straight: the keyword handling around it took two fifths of the time, and a worker's step
    serializes every job's event."""
    return event.__pydantic_serializer__.to_json(event).decode()


@dataclass(frozen=True)
class Progress:
    """What a job's stream holds so far: the seq its next event takes and the tokens already emitted
    (of its first choice: the job's output).

    A worker that resumes another's job continues from here, so the stream stays one sequence.
    """

    next_seq: int
    token_ids: list[int] = field(default_factory=list)
    text: str = ""
    reasoning: str = ""
    tool_call_parts: list[ToolCallDelta] = field(default_factory=list)

    @classmethod
    def of(cls, events: Iterable[Event]) -> Progress:
        next_seq, token_ids, texts, reasonings, parts = 0, [], [], [], []
        for event in events:
            next_seq = event.seq + 1
            if isinstance(event, DeltaEvent) and event.index == 0:
                token_ids.extend(event.token_ids)
                texts.append(event.text)
                reasonings.append(event.reasoning)
                parts.extend(event.tool_calls or [])
        return cls(next_seq, token_ids, "".join(texts), "".join(reasonings), parts)


def whole_calls(parts: Iterable[ToolCallDelta]) -> list[ToolCall]:
    """The calls a choice's tool-call parts add up to, in order: each call's id and name from the
    parts that carry them, its arguments the fragments end to end."""
    ids: dict[int, str] = {}
    names: dict[int, str] = {}
    arguments: dict[int, list[str]] = {}
    for part in parts:
        if part.id:
            ids.setdefault(part.index, part.id)
        if part.function.name:
            names.setdefault(part.index, part.function.name)
        arguments.setdefault(part.index, []).append(part.function.arguments)
    return [
        ToolCall(
            id=ids.get(index, f"call_{index}"),
            function=FunctionCall(name=names.get(index, "?"), arguments="".join(arguments[index])),
        )
        for index in sorted(arguments)
        if index in names  # a call cut before its name came is none
    ]
