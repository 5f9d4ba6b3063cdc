"""Job events: one Redis stream entry, one SSE event, one element of a long-poll page."""

from __future__ import annotations

from enum import Enum
from typing import Annotated, Literal

from pydantic import BaseModel, Field, TypeAdapter


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


class TopLogprob(BaseModel):
    token_id: int
    token: str
    logprob: float


class TokenLogprob(BaseModel):
    """Log-probability of a sampled token and, when asked for, its most likely alternatives."""

    token_id: int
    token: str
    logprob: float
    top_logprobs: list[TopLogprob] = []


class StatusEvent(BaseModel):
    type: Literal["status"] = "status"
    seq: int
    state: JobState
    message: str | None = None


class DeltaEvent(BaseModel):
    type: Literal["delta"] = "delta"
    seq: int
    text: str
    token_ids: list[int]
    logprobs: list[TokenLogprob] | None = None


class DoneEvent(BaseModel):
    type: Literal["done"] = "done"
    seq: int
    finish_reason: str
    usage: Usage


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
