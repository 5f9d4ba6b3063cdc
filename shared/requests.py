"""Request and response bodies of the native job API."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from shared.events import JobState, Usage

MAX_PROMPT_CHARS = 1_000_000
MAX_STOP_STRINGS = 16

StopString = Annotated[str, Field(min_length=1, max_length=256)]


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    role: Literal["system", "user", "assistant"]
    content: str = Field(max_length=MAX_PROMPT_CHARS)


class JobRequest(BaseModel):
    """What to generate and how; either `prompt` or `messages` (rendered with the chat template)."""

    model_config = ConfigDict(extra="forbid", strict=True)

    prompt: str | None = Field(None, min_length=1, max_length=MAX_PROMPT_CHARS)
    messages: list[ChatMessage] | None = Field(None, min_length=1, max_length=1024)
    max_tokens: int = Field(256, ge=1, le=1_000_000)
    temperature: float = Field(1.0, ge=0.0, le=2.0)
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    top_k: int | None = Field(None, ge=1, le=100_000)
    seed: int | None = Field(None, ge=0, le=2**63 - 1)
    stop: StopString | list[StopString] | None = Field(None, description="strings that end generation")
    stream_step: int = Field(1, ge=1, le=1024, description="tokens per delta event")
    logprobs: int | None = Field(None, ge=0, le=20, description="alternatives to report per token")

    @model_validator(mode="after")
    def _one_input(self) -> JobRequest:
        if (self.prompt is None) == (self.messages is None):
            raise ValueError("give exactly one of 'prompt' or 'messages'")
        if isinstance(self.stop, list) and len(self.stop) > MAX_STOP_STRINGS:
            raise ValueError(f"at most {MAX_STOP_STRINGS} stop strings")
        return self

    @property
    def stop_strings(self) -> list[str]:
        if self.stop is None:
            return []
        return [self.stop] if isinstance(self.stop, str) else list(self.stop)


class JobUrls(BaseModel):
    self: str
    events: str
    cancel: str


class JobAccepted(BaseModel):
    """Answer to a submission (202)."""

    id: str
    status: JobState
    created_at: datetime
    urls: JobUrls


class JobOutput(BaseModel):
    text: str
    token_count: int


class JobRecord(BaseModel):
    """What `GET /v1/jobs/{id}` answers."""

    id: str
    status: JobState
    model: str | None = None
    worker: str | None = None
    created_at: datetime
    started_at: datetime | None = None
    finished_at: datetime | None = None
    output: JobOutput
    finish_reason: str | None = None
    usage: Usage | None = None
    error: str | None = None
    queue_position: int | None = None


class CancelAnswer(BaseModel):
    id: str
    status: JobState
    message: str


class EventsPage(BaseModel):
    """A long-poll answer: the events after the cursor, and the cursor to ask from next."""

    events: list[dict[str, object]]
    cursor: str
    status: JobState
    done: bool
