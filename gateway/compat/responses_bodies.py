"""OpenAI's Responses API request, to a streampool job and the Response's own fields. Pure, no I/O.

A response is one job: its chat messages are the `instructions` (as a system message), the
conversation of `previous_response_id` (that response's input and output, as OpenAI carries them
over; its instructions are not) and this `input`. The job is a turn of that conversation
(`shared.jobstore.Turn`): it keeps `instructions` and this `input` alone, and names the previous
response's job, from which the conversation is read back, so that a conversation is stored once.
What the job does not carry (metadata, instructions, the input items' ids...) is kept beside it in
the record's annotations (`Stored`).
What a job cannot do (tools, reasoning, files, images) is refused with the parameter named.
The Response reports the sampling values the job used, its defaults included, and what does not
apply to a text model with the Open Responses specification's empty values
(`gateway.compat.responses_answers`).
"""

from __future__ import annotations

import json
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from gateway.compat.openai_bodies import (
    Integer,
    Name,
    Objects,
    PromptText,
    Refusal,
    SamplingOptions,
    job_request_of,
)
from shared.errors import InvalidRequest
from shared.jobstore import Turn
from shared.requests import MAX_MESSAGES, MAX_URL_CHARS, ChatMessage, JobRequest, Text
from shared.webhooks import API, RESPONSE_API

RESPONSES_PATH = "/v1/responses"
MAX_METADATA = 16  # OpenAI's limits: 16 pairs, keys of 64 characters, values of 512
MetadataKey = Annotated[Text, Field(max_length=64)]
MetadataValue = Annotated[Text, Field(max_length=512)]
Metadata = Annotated[dict[MetadataKey, MetadataValue], Field(max_length=MAX_METADATA)]
DEFAULT_MAX_TOKENS: int = JobRequest.model_fields["max_tokens"].default
SAMPLED = ("temperature", "top_p", "presence_penalty", "frequency_penalty")
"""The job's sampling values that a Response reports, under the same names."""
TEXT_PARTS = ("input_text", "output_text")
TEXT_PART = {
    "user": "input_text",
    "system": "input_text",
    "developer": "input_text",
    "assistant": "output_text",
}


class ContentPart(BaseModel):
    """A part of an input message; only text parts can go into a job (`ResponsesBody` refuses the others,
    naming the part)."""

    model_config = ConfigDict(extra="allow")

    type: Name
    text: PromptText | None = None


class InputMessage(BaseModel):
    """A message item of `input`; OpenAI's short form (no `type`) included."""

    model_config = ConfigDict(extra="forbid")

    type: Literal["message"] = "message"
    role: Literal["user", "system", "developer", "assistant"]
    content: PromptText | Annotated[list[ContentPart], Field(max_length=MAX_MESSAGES)]
    id: Name | None = None
    status: Literal["in_progress", "completed", "incomplete"] | None = None

    @field_validator("content")
    @classmethod
    def _text_parts_have_text(cls, content: str | list[ContentPart]) -> str | list[ContentPart]:
        for part in content if isinstance(content, list) else []:
            if part.type in TEXT_PARTS and part.text is None:
                raise ValueError(f"a part of type {part.type!r} needs its text")
        return content

    @property
    def parts(self) -> list[ContentPart]:
        return self.content if isinstance(self.content, list) else []

    @property
    def text(self) -> str:
        if isinstance(self.content, str):
            return self.content
        return "".join(part.text or "" for part in self.content)

    def job_message(self) -> ChatMessage:
        """As the chat template takes it: `developer` as `system`."""
        return ChatMessage(role="system" if self.role == "developer" else self.role, content=self.text)


class TextFormat(BaseModel):
    """`text.format`: plain text, or JSON (any object, or one a schema describes)."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True, serialize_by_alias=True)

    type: Literal["text", "json_object", "json_schema"]
    name: Name | None = None
    schema_: dict[str, Any] | None = Field(None, alias="schema")
    description: Text | None = None
    strict: bool | None = None

    def as_used(self) -> dict[str, Any]:
        """As the Response reports it: a JSON schema's with its `description` (null without one) and
        `strict: true`, as the worker's grammar holds the output to the schema whatever `strict` said."""
        if self.type != "json_schema":
            return {"type": self.type}
        return {**self.model_dump(exclude_none=True), "description": self.description, "strict": True}


class TextConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    format: TextFormat = TextFormat(type="text")
    verbosity: Literal["low", "medium", "high"] | None = None  # a hint for reasoning models


class Stored(BaseModel):
    """The Response's own fields, which the job does not carry: kept in its record's annotations, one
    JSON value per field, beside `api`."""

    model: str
    instructions: str | None = None
    metadata: dict[str, str] = {}
    background: bool = False
    store: bool = True
    previous_response_id: str | None = None
    text: dict[str, Any] = {"format": {"type": "text"}}
    # The values the job sampled with (given, or the job's defaults).
    temperature: float = JobRequest.model_fields["temperature"].default
    top_p: float = JobRequest.model_fields["top_p"].default
    presence_penalty: float = JobRequest.model_fields["presence_penalty"].default
    frequency_penalty: float = JobRequest.model_fields["frequency_penalty"].default
    max_output_tokens: int | None = None
    safety_identifier: str | None = None
    prompt_cache_key: str | None = None
    input: list[dict[str, str]] = []
    """This response's input messages: role, and the id the client gave, if any (their text is the
    job's own messages')."""

    def annotations(self) -> dict[str, str]:
        return {
            API: RESPONSE_API,  # a webhook sender names this job's events `response.*`
            **{name: json.dumps(value) for name, value in self.model_dump(mode="json").items()},
        }

    def input_items(self, job_id: str, messages: list[ChatMessage]) -> list[dict[str, Any]]:
        """The input items as `input_items` lists them, their text the job's own `messages`: each with
        the id the client gave, or one of its own where it gave none or one an earlier item has, so
        that an item's id names it alone (`after` pages from it)."""
        items = []
        seen: set[str] = set()
        for n, (item, message) in enumerate(zip(self.input, messages, strict=True)):
            given = item.get("id")
            item_id = given if given and given not in seen else f"msg_{job_id}_{n}"
            seen.add(item_id)
            text = {"type": TEXT_PART[item["role"]], "text": message.content}
            items.append(
                {
                    "id": item_id,
                    "type": "message",
                    "role": item["role"],
                    "status": "completed",
                    "content": [text | ({"annotations": []} if item["role"] == "assistant" else {})],
                }
            )
        return items

    @classmethod
    def of_annotations(cls, annotations: dict[str, str]) -> Stored | None:
        """The fields of a response's job; None for a job of another API."""
        if annotations.get(API) != RESPONSE_API:
            return None
        # Beside its own fields the job may keep others (its webhook's), which are not the Response's.
        # A null is the field's default: a record kept null where its job took the default temperature
        # or top_p.
        fields = {name: json.loads(value) for name, value in annotations.items() if name in cls.model_fields}
        return cls.model_validate({name: value for name, value in fields.items() if value is not None})


class ResponsesBody(SamplingOptions):
    """`POST /v1/responses`."""

    model: Name
    input: PromptText | Annotated[list[InputMessage], Field(min_length=1, max_length=MAX_MESSAGES)]
    instructions: PromptText | None = None
    max_output_tokens: Integer | None = None
    stream: bool | None = False
    background: bool | None = False
    store: bool | None = True
    metadata: Metadata | None = None
    previous_response_id: Name | None = None
    text: TextConfig | None = None
    # Refused when given a value that asks for something a job cannot do.
    tools: Objects | None = None
    tool_choice: Name | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None  # meaningless without tools
    max_tool_calls: Integer | None = None
    reasoning: dict[str, Any] | None = None
    include: Objects | None = None
    prompt: dict[str, Any] | None = None
    conversation: Name | dict[str, Any] | None = None
    truncation: Literal["auto", "disabled"] | None = None
    top_logprobs: Integer | None = None
    stream_options: dict[str, Any] | None = None
    service_tier: Name | None = None
    prompt_cache_key: Name | None = None  # a caching hint: nothing to do here
    safety_identifier: Name | None = None  # for OpenAI's abuse monitoring: nothing to do here
    # streampool's own: where to announce the response's end (see docs/webhooks.md).
    webhook: Annotated[Text, Field(min_length=1, max_length=MAX_URL_CHARS)] | None = None

    def _refusals(self) -> list[Refusal]:
        return [
            (bool(self.tools), "tools", "tool calling is not supported"),
            (self.tool_choice not in (None, "none", "auto"), "tool_choice", "tool calling is not supported"),
            (self.max_tool_calls is not None, "max_tool_calls", "tool calling is not supported"),
            (bool(self.reasoning), "reasoning", "reasoning options are not supported"),
            (bool(self.include), "include", "no additional output data is available"),
            (self.prompt is not None, "prompt", "prompt templates are not supported"),
            (
                self.conversation is not None,
                "conversation",
                "conversations are not supported; use previous_response_id",
            ),
            (self.truncation == "auto", "truncation", "only truncation 'disabled' is supported"),
            (bool(self.top_logprobs), "top_logprobs", "logprobs are not supported"),
            (self.stream_options is not None and not self.stream, "stream_options", "needs stream=true"),
            (
                self.service_tier not in (None, "auto", "default"),
                "service_tier",
                "only the default tier exists",
            ),
            (
                bool(self.background) and self.store is False,
                "background",
                "background responses must be stored: give store=true",
            ),
            (
                self.text is not None
                and self.text.format.type == "json_schema"
                and self.text.format.schema_ is None,
                "text.format",
                "type 'json_schema' needs a schema",
            ),
            (
                self.text is not None
                and self.text.format.type == "json_schema"
                and self.text.format.name is None,
                "text.format.name",
                "type 'json_schema' needs a name",
            ),
            *(
                (True, f"input.{m}.content.{p}", f"only text content parts are supported, not {part.type!r}")
                for m, message in enumerate(self.input_messages)
                for p, part in enumerate(message.parts)
                if part.type not in TEXT_PARTS
            ),
        ]

    def _structured_outputs(self) -> dict[str, Any] | None:
        kind = None if self.text is None else self.text.format
        if kind is None or kind.type == "text":
            return None
        return {"json_object": True} if kind.type == "json_object" else {"json": kind.schema_}

    @property
    def input_messages(self) -> list[InputMessage]:
        if isinstance(self.input, str):
            return [InputMessage(role="user", content=self.input)]
        return self.input

    def refuse_unsupported(self) -> None:
        for refused, param, reason in self._refusals():
            if refused:
                raise InvalidRequest(f"{param}: {reason}", param=param, code="unsupported_parameter")

    def in_own_terms(self, exc: InvalidRequest) -> InvalidRequest:
        """A refusal of a job field (the gateway's limits), under this API's parameter name."""
        if exc.field is None:
            return exc
        param = "max_output_tokens" if exc.field == "max_tokens" else exc.field
        return InvalidRequest(f"{param}: {exc.reason}", param=param, code="invalid_value")

    def stored(self, job: JobRequest) -> Stored:
        """The fields kept beside `job` (this body's), its sampling values as it has them."""
        items = [
            message.model_dump(include={"id", "role"}, exclude_none=True) for message in self.input_messages
        ]
        return Stored(
            model=self.model,
            instructions=self.instructions,
            metadata=self.metadata or {},
            background=bool(self.background),
            store=self.store is not False,
            previous_response_id=self.previous_response_id,
            text={"format": (self.text or TextConfig()).format.as_used()},
            **job.model_dump(include=set(SAMPLED)),
            max_output_tokens=self.max_output_tokens,
            safety_identifier=self.safety_identifier,
            prompt_cache_key=self.prompt_cache_key,
            input=items,
        )

    @property
    def _instructions(self) -> list[ChatMessage]:
        return [] if self.instructions is None else [ChatMessage(role="system", content=self.instructions)]

    def turn(self, previous: str | None, earlier: tuple[ChatMessage, ...]) -> Turn:
        """Where the job's messages join the conversation: past its instructions, after the conversation
        `earlier` that the job `previous` (`previous_response_id`'s) ended."""
        return Turn(len(self._instructions), previous, earlier)

    def job_request(self, max_tokens_limit: int) -> JobRequest:
        """The job: `instructions`, then this input (the conversation before it joins at `turn`).

        Without `max_output_tokens` the job gets the chat route's default, within the gateway's limit,
        which admission raises to what the context leaves; a value over the limit is admission's to
        refuse. Call it after `refuse_unsupported`.
        """
        fields = {
            "max_tokens": min(DEFAULT_MAX_TOKENS, max_tokens_limit)
            if self.max_output_tokens is None
            else self.max_output_tokens,
            **self.sampling_fields(),
            "structured_outputs": self._structured_outputs(),
            "messages": [*self._instructions, *(message.job_message() for message in self.input_messages)],
        }
        fields = {name: value for name, value in fields.items() if value is not None}
        names = {"max_tokens": "max_output_tokens", "messages": "input", "structured_outputs": "text.format"}
        return job_request_of(fields, names)
