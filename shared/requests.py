"""Request and response bodies of the native job API."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Literal

from pydantic import (
    AfterValidator,
    AwareDatetime,
    BaseModel,
    ConfigDict,
    Field,
    field_serializer,
    model_validator,
)

from shared.events import JobState, Usage

MAX_PROMPT_CHARS = 1_000_000
MAX_MESSAGES = 1024
MAX_STOP_STRINGS = 16
MAX_STOP_CHARS = 256
QUICK_TO_TOKENIZE_CHARS = 2_000
"""A prompt this short is tokenized on the event loop (well under a millisecond): a thread hop costs more."""


def _plain_text(value: str) -> str:
    """Text that tokenizers, templates and Redis all take as it is."""
    if "\x00" in value:
        raise ValueError("must not contain NUL characters")
    if not value.isascii():
        try:
            value.encode()
        except UnicodeEncodeError:
            raise ValueError("must be valid Unicode text (it holds a lone surrogate)") from None
    return value


Text = Annotated[str, AfterValidator(_plain_text)]
"""A string that holds no NUL and no lone surrogate (which JSON's `\\ud800` escapes can make)."""

StopString = Annotated[Text, Field(min_length=1, max_length=MAX_STOP_CHARS)]


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    role: Literal["system", "user", "assistant"]
    content: Text = Field(max_length=MAX_PROMPT_CHARS)


class JobRequest(BaseModel):
    """What to generate and how; either `prompt` or `messages` (rendered with the chat template)."""

    model_config = ConfigDict(extra="forbid", strict=True)

    prompt: Text | None = Field(None, min_length=1, max_length=MAX_PROMPT_CHARS)
    messages: list[ChatMessage] | None = Field(None, min_length=1, max_length=MAX_MESSAGES)
    max_tokens: int = Field(256, ge=1, le=1_000_000)
    temperature: float = Field(1.0, ge=0.0, le=2.0)
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    top_k: int | None = Field(None, ge=1, le=100_000)
    seed: int | None = Field(None, ge=0, le=2**63 - 1)
    stop: StopString | Annotated[list[StopString], Field(max_length=MAX_STOP_STRINGS)] | None = Field(
        None, description="strings that end generation"
    )
    stream_step: int = Field(1, ge=1, le=1024, description="tokens per delta event")
    logprobs: int | None = Field(None, ge=0, le=20, description="alternatives to report per token")
    deadline: AwareDatetime | None = Field(
        None, strict=False, description="RFC 3339 or unix seconds; still queued then, the job fails unrun"
    )

    @field_serializer("deadline")
    def _deadline_as_unix_seconds(self, deadline: datetime | None) -> float | None:
        """Unix seconds, which the job store's start script compares with its clock."""
        return None if deadline is None else deadline.timestamp()

    @model_validator(mode="after")
    def _one_input(self) -> JobRequest:
        if (self.prompt is None) == (self.messages is None):
            raise ValueError("give exactly one of 'prompt' or 'messages'")
        return self

    @property
    def quick_to_tokenize(self) -> bool:
        """Short enough to tokenize on the event loop; a longer prompt goes to a thread."""
        chars = len(self.prompt or "") + sum(len(message.content) for message in self.messages or [])
        return chars <= QUICK_TO_TOKENIZE_CHARS

    @property
    def stop_strings(self) -> list[str]:
        if self.stop is None:
            return []
        return [self.stop] if isinstance(self.stop, str) else list(self.stop)


class ErrorBody(BaseModel):
    """Every error answer of the native and TGI routes; some carry more fields (`detail`, ...)."""

    model_config = ConfigDict(extra="allow")

    error: str
    error_type: str


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
    attempts: int = Field(0, description="runs so far: 1 once started, one more each time it was resumed")


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
