"""OpenAI's Responses API request, to a streampool job and the Response's own fields. Pure, no I/O.

A response is one job: its chat messages are the `instructions` (as a system message), the
conversation of `previous_response_id` (that response's input and output, as OpenAI carries them
over; its instructions are not) and this `input`. The job is a turn of that conversation
(`shared.jobstore.Turn`): it keeps `instructions` and this `input` alone, and names the previous
response's job, from which the conversation is read back, so that a conversation is stored once.
Input items become the chat's messages as vLLM makes them: `function_call` items the assistant's
`tool_calls`, `function_call_output` items `tool` messages, `reasoning` items the assistant's
`reasoning`; function `tools`, `tool_choice`, `parallel_tool_calls` and `reasoning.effort` become the
job's chat options, `include` of the output text's logprobs its `logprobs`, `truncation: auto` its
`truncate_prompt_tokens=-1`.
What the job does not carry (metadata, instructions, the input items' ids...) is kept beside it in
the record's annotations (`Stored`).
What a job cannot do (built-in tools, files, images) is refused with the parameter named.
The Response reports the sampling values the job used, its defaults included, and what does not
apply to a text model with the Open Responses specification's empty values
(`gateway.compat.responses_answers`).
"""

from __future__ import annotations

import json
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Discriminator, Field, Tag, ValidationError, field_validator

from gateway.compat.openai_bodies import (
    Integer,
    Metadata,
    Name,
    PromptText,
    Refusal,
    SamplingOptions,
    extra_fields,
    in_terms,
    job_request_of,
)
from shared.chat import MAX_TOOLS, ReasoningEffort
from shared.errors import InvalidRequest
from shared.jobstore import Turn
from shared.requests import MAX_MESSAGES, MAX_URL_CHARS, ChatMessage, Deadline, JobRequest, Text
from shared.webhooks import API, RESPONSE_API

RESPONSES_PATH = "/v1/responses"
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
    """A message item of `input`; OpenAI's short form (no `type`) included, and an assistant's output
    message sent back as it came (its parts `output_text`)."""

    model_config = ConfigDict(extra="ignore")  # an output item sent back keeps its other fields

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


class FunctionCallItem(BaseModel):
    """A call the model made (`function_call`), sent back with the conversation."""

    model_config = ConfigDict(extra="ignore")

    type: Literal["function_call"]
    call_id: Name
    name: Name
    arguments: PromptText
    id: Name | None = None
    status: Literal["in_progress", "completed", "incomplete"] | None = None


class FunctionCallOutputItem(BaseModel):
    """What a call returned (`function_call_output`): text, or text parts."""

    model_config = ConfigDict(extra="ignore")

    type: Literal["function_call_output"]
    call_id: Name
    output: PromptText | Annotated[list[ContentPart], Field(max_length=MAX_MESSAGES)]
    id: Name | None = None
    status: Literal["in_progress", "completed", "incomplete"] | None = None

    @property
    def parts(self) -> list[ContentPart]:
        return self.output if isinstance(self.output, list) else []

    @property
    def text(self) -> str:
        if isinstance(self.output, str):
            return self.output
        return "".join(part.text or "" for part in self.output)


class ReasoningPart(BaseModel):
    model_config = ConfigDict(extra="ignore")

    type: Literal["reasoning_text", "summary_text"]
    text: PromptText


class ReasoningItem(BaseModel):
    """The model's reasoning (`reasoning`), sent back: its text is its content's first part, else its
    summary's, as vLLM reads it; encrypted content is refused as vLLM refuses it."""

    model_config = ConfigDict(extra="ignore")

    type: Literal["reasoning"]
    id: Name | None = None
    summary: Annotated[list[ReasoningPart], Field(max_length=MAX_MESSAGES)] = []
    content: Annotated[list[ReasoningPart], Field(max_length=MAX_MESSAGES)] | None = None
    encrypted_content: Text | None = None
    status: Literal["in_progress", "completed", "incomplete"] | None = None

    @property
    def text(self) -> str:
        parts = self.content or self.summary
        return parts[0].text if parts else ""


def _item_type(item: Any) -> str:
    """The kind of an input item: a message where `type` is left out (OpenAI's short form)."""
    kind = item.get("type", "message") if isinstance(item, dict) else getattr(item, "type", "message")
    return str(kind)


InputItem = Annotated[
    Annotated[InputMessage, Tag("message")]
    | Annotated[FunctionCallItem, Tag("function_call")]
    | Annotated[FunctionCallOutputItem, Tag("function_call_output")]
    | Annotated[ReasoningItem, Tag("reasoning")],
    Discriminator(_item_type),
]
ITEM_PREFIXES = {"message": "msg", "function_call": "fc", "function_call_output": "fco", "reasoning": "rs"}
"""The id of an input item the client gave none: `<prefix>_<job id>_<its place>`."""


class FunctionToolParam(BaseModel):
    """A function tool of `tools`, in the Responses shape (flat: no `function` object)."""

    model_config = ConfigDict(extra="ignore")  # vLLM's own extras (`defer_loading`) are ignored

    type: Literal["function"]
    name: Name
    description: PromptText | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None

    def chat_tool(self) -> dict[str, Any]:
        """As a chat's job takes it (`shared.chat.Tool`), as vLLM hands it to the chat template."""
        return {"type": "function", "function": self.model_dump(exclude={"type"}, exclude_none=True)}

    def as_reported(self) -> dict[str, Any]:
        """As a Response lists it: every field, null where not given."""
        return self.model_dump()


class Conversation:
    """The chat messages a body's input items make, as vLLM's `construct_chat_messages_with_tool_call`
    makes them: a call joins the assistant message before it (its `tool_calls`), reasoning and an
    assistant's text join one that has none yet; and where each item went (`places`)."""

    def __init__(self) -> None:
        self.messages: list[dict[str, Any]] = []
        self.places: list[dict[str, Any]] = []

    def _assistant(self, missing: str | None) -> tuple[dict[str, Any], bool]:
        """The assistant message an item joins: the last message where it is the assistant's and lacks
        `missing` (None: whatever it has), else a new one (and True)."""
        last = self.messages[-1] if self.messages else None
        if last is not None and last["role"] == "assistant" and (missing is None or missing not in last):
            return last, False
        return {"role": "assistant"}, True

    def add(self, item: InputItem) -> None:
        place: dict[str, Any] = {"type": item.type}
        if item.id is not None:
            place["id"] = item.id
        if isinstance(item, FunctionCallItem):
            message, new = self._assistant(None)  # calls gather in the assistant message before them
            calls = message.setdefault("tool_calls", [])
            place["call"] = len(calls)
            calls.append({"id": item.call_id, "function": {"name": item.name, "arguments": item.arguments}})
        elif isinstance(item, ReasoningItem):
            message, new = self._assistant("reasoning")
            message["reasoning"] = item.text
        elif isinstance(item, FunctionCallOutputItem):
            message, new = {"role": "tool", "content": item.text, "tool_call_id": item.call_id}, True
        elif item.role == "assistant":
            message, new = self._assistant("content")
            message["content"] = item.text
        else:
            place["role"] = item.role
            role = "system" if item.role == "developer" else item.role  # as the chat template takes it
            message, new = {"role": role, "content": item.text}, True
        if new:
            self.messages.append(message)
        place["at"] = len(self.messages) - 1
        self.places.append(place)

    def chat_messages(self) -> list[dict[str, Any]]:
        """The messages, for the job to check (`ChatMessage`); an assistant's without text has empty
        content, as vLLM renders one for a template that takes text (one that joins strings fails on
        none)."""
        return [
            {"content": ""} | message if message["role"] == "assistant" else message
            for message in self.messages
        ]


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
    model_config = ConfigDict(extra="allow")  # as vLLM's: taken and ignored

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
    tools: list[dict[str, Any]] = []
    tool_choice: str | dict[str, Any] = "none"
    parallel_tool_calls: bool = True
    reasoning: dict[str, Any] | None = None
    truncation: str = "disabled"
    top_logprobs: int = 0
    output_logprobs: bool = False
    """`include` asked for `message.output_text.logprobs`."""
    input: list[dict[str, Any]] = []
    """This response's input items: each one's type, the id the client gave, if any, a message's role,
    and where it went among the job's own messages (`at`; a call: which of that message's `call`),
    whose text is theirs (`Conversation.places`)."""

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
        for n, place in enumerate(self.input):
            kind = place.get("type", "message")
            given = place.get("id")
            item_id = given if given and given not in seen else f"{ITEM_PREFIXES[kind]}_{job_id}_{n}"
            seen.add(item_id)
            message = messages[place.get("at", n)]
            items.append({"id": item_id, **_input_item(kind, place, message)})
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


def _input_item(kind: str, place: dict[str, Any], message: ChatMessage) -> dict[str, Any]:
    """An input item but for its id, as `input_items` lists it, from the job's message it went into."""
    if kind == "function_call":
        call = (message.tool_calls or [])[place["call"]].function
        return {
            "type": "function_call",
            "call_id": (message.tool_calls or [])[place["call"]].id,
            "name": call.name,
            "arguments": call.arguments,
            "status": "completed",
        }
    if kind == "function_call_output":
        return {
            "type": "function_call_output",
            "call_id": message.tool_call_id,
            "output": message.content,
            "status": "completed",
        }
    if kind == "reasoning":
        reasoning = [{"type": "reasoning_text", "text": message.reasoning or ""}]
        return {"type": "reasoning", "summary": [], "content": reasoning, "status": "completed"}
    role = place.get("role", "assistant")
    text = {"type": TEXT_PART[role], "text": message.content or ""}
    return {
        "type": "message",
        "role": role,
        "status": "completed",
        "content": [text | ({"annotations": []} if role == "assistant" else {})],
    }


class ReasoningOptions(BaseModel):
    """`reasoning`: its effort goes to the chat template (`reasoning_effort`), as vLLM passes it;
    a summary is not made (none is reported)."""

    model_config = ConfigDict(extra="forbid")

    effort: ReasoningEffort | None = None
    summary: Literal["auto", "concise", "detailed"] | None = None
    generate_summary: Literal["auto", "concise", "detailed"] | None = None  # its older name


NamedToolChoice = dict[str, Any]
"""`{"type": "function", "name": ...}`, checked by `ResponsesBody._tool_choice`."""
Includable = Literal[
    "code_interpreter_call.outputs",
    "computer_call_output.output.image_url",
    "file_search_call.results",
    "message.input_image.image_url",
    "message.output_text.logprobs",
    "reasoning.encrypted_content",
]
"""What vLLM's `include` takes; only the output text's logprobs are made, the others are nothing a job
has (no built-in tools, no images, no encrypted reasoning)."""
LOGPROBS = "message.output_text.logprobs"
MAX_TOP_LOGPROBS = 20


class ResponsesBody(SamplingOptions):
    """`POST /v1/responses`. Fields it does not define are taken and ignored, as vLLM's Responses
    request takes them (`ignored_fields`)."""

    model_config = ConfigDict(extra="allow")

    model: Name
    input: PromptText | Annotated[list[InputItem], Field(min_length=1, max_length=MAX_MESSAGES)]
    instructions: PromptText | None = None
    max_output_tokens: Integer | None = None
    stream: bool | None = False
    background: bool | None = False
    store: bool | None = True
    metadata: Metadata | None = None
    previous_response_id: Name | None = None
    text: TextConfig | None = None
    tools: Annotated[list[dict[str, Any]], Field(max_length=MAX_TOOLS)] | None = None
    tool_choice: Name | NamedToolChoice | None = None
    parallel_tool_calls: bool | None = None
    reasoning: ReasoningOptions | None = None
    include: Annotated[list[Includable], Field(max_length=16)] | None = None
    truncation: Literal["auto", "disabled"] | None = None
    top_logprobs: Integer | None = None
    # vLLM's own, as its Responses request takes them.
    include_reasoning: bool | None = None
    chat_template_kwargs: Annotated[dict[Name, Any], Field(max_length=128)] | None = None
    # Refused when given a value that asks for something a job cannot do.
    max_tool_calls: Integer | None = None
    prompt: dict[str, Any] | None = None
    conversation: Name | dict[str, Any] | None = None
    stream_options: dict[str, Any] | None = None
    service_tier: Name | None = None
    prompt_cache_key: Name | None = None  # a caching hint: nothing to do here
    safety_identifier: Name | None = None  # for OpenAI's abuse monitoring: nothing to do here
    # streampool's own: where to announce the response's end (see docs/webhooks.md).
    webhook: Annotated[Text, Field(min_length=1, max_length=MAX_URL_CHARS)] | None = None
    deadline: Deadline | None = None  # streampool's: still queued then, the response fails unrun

    @property
    def ignored_fields(self) -> list[str]:
        return extra_fields(self)

    def _refusals(self) -> list[Refusal]:
        return [
            *(
                (True, "tools", f"only function tools are supported, not {tool.get('type')!r}")
                for tool in self.tools or []
                if tool.get("type") != "function"
            ),
            (self.max_tool_calls is not None, "max_tool_calls", "a bound on tool calls is not supported"),
            (self.prompt is not None, "prompt", "prompt templates are not supported"),
            (
                self.conversation is not None,
                "conversation",
                "conversations are not supported; use previous_response_id",
            ),
            (
                self.top_logprobs is not None and not 0 <= self.top_logprobs <= MAX_TOP_LOGPROBS,
                "top_logprobs",
                f"must be between 0 and {MAX_TOP_LOGPROBS}",
            ),
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
                (True, param, f"only text content parts are supported, not {kind!r}")
                for param, kind in self._other_parts()
            ),
        ]

    def _other_parts(self) -> list[tuple[str, str]]:
        """(parameter, type) of each content part of the input that is not text."""
        parts = []
        for m, item in enumerate(self.input_items):
            if isinstance(item, InputMessage):
                parts += [(f"input.{m}.content.{p}", part.type) for p, part in enumerate(item.parts)]
            elif isinstance(item, FunctionCallOutputItem):
                parts += [(f"input.{m}.output.{p}", part.type) for p, part in enumerate(item.parts)]
        return [(param, kind) for param, kind in parts if kind not in TEXT_PARTS]

    def _vllm_refusal(self) -> tuple[str, str] | None:
        """(parameter, vLLM's words) where vLLM's Responses request refuses the tools, the tool choice
        or the input items as given."""
        names = [tool.name for tool in self.function_tools]
        choice = self.tool_choice
        if isinstance(choice, str) and choice not in ("none", "auto", "required"):
            return "tool_choice", f"Invalid value for `tool_choice`: {choice}! Only a named function, " + (
                '"none", "auto" or "required" are supported.'
            )
        if choice == "required" and not names:
            return "tool_choice", "Tool choice 'required' must be specified with 'tools' parameter."
        if isinstance(choice, dict):
            if choice.get("type") != "function":
                return "tool_choice", f"only function tool choices are supported, not {choice.get('type')!r}"
            if choice.get("name") not in names:
                return "tool_choice", "Tool choice 'function' not found in 'tools' parameter."
        for m, item in enumerate(self.input_items):
            if isinstance(item, ReasoningItem) and item.encrypted_content:
                return f"input.{m}", "Encrypted content is not supported."
        return None

    @property
    def function_tools(self) -> list[FunctionToolParam]:
        """The function tools (`refuse_unsupported` refuses any other kind)."""
        tools = []
        for n, tool in enumerate(self.tools or []):
            if tool.get("type") != "function":
                continue
            try:
                tools.append(FunctionToolParam.model_validate(tool))
            except ValidationError as exc:
                error = exc.errors()[0]
                param = ".".join(["tools", str(n), *(str(part) for part in error["loc"])])
                raise InvalidRequest(f"{param}: {error['msg']}", param=param, code=error["type"]) from exc
        return tools

    @property
    def reported_tool_choice(self) -> str | dict[str, Any]:
        """The choice the job makes, as vLLM reports it: `auto` by default, `none` without tools."""
        choice = self.tool_choice or "auto"
        if not self.tools and choice == "auto":
            return "none"
        return {"type": "function", "name": choice["name"]} if isinstance(choice, dict) else choice

    @property
    def output_logprobs(self) -> bool:
        return LOGPROBS in (self.include or [])

    @property
    def continues_final_item(self) -> bool:
        """The last input item is an assistant's message or reasoning cut short (`in_progress` or
        `incomplete`): the job goes on with it, as vLLM's `should_continue_final_message` says."""
        last = self.input_items[-1]
        cut = last.status in ("in_progress", "incomplete")
        return cut and (isinstance(last, ReasoningItem) or getattr(last, "role", None) == "assistant")

    def _structured_outputs(self) -> dict[str, Any] | None:
        kind = None if self.text is None else self.text.format
        if kind is None or kind.type == "text":
            return None
        return {"json_object": True} if kind.type == "json_object" else {"json": kind.schema_}

    @property
    def input_items(self) -> list[InputItem]:
        if isinstance(self.input, str):
            return [InputMessage(role="user", content=self.input)]
        return self.input

    def conversation_of_input(self) -> Conversation:
        conversation = Conversation()
        for item in self.input_items:
            conversation.add(item)
        return conversation

    def refuse_unsupported(self) -> None:
        """`InvalidRequest` naming the first parameter a job cannot honour or vLLM refuses as given."""
        for refused, param, reason in self._refusals():
            if refused:
                raise InvalidRequest(f"{param}: {reason}", param=param, code="unsupported_parameter")
        if (refusal := self._vllm_refusal()) is not None:
            raise InvalidRequest(refusal[1], param=refusal[0], code="invalid_value")

    def in_own_terms(self, exc: InvalidRequest) -> InvalidRequest:
        """A refusal of a job field (the gateway's limits), under this API's parameter name."""
        return in_terms(exc, PARAMETERS)

    def stored(self, job: JobRequest) -> Stored:
        """The fields kept beside `job` (this body's), its sampling values as it has them."""
        reasoning = self.reasoning
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
            tools=[tool.as_reported() for tool in self.function_tools],
            tool_choice=self.reported_tool_choice,
            parallel_tool_calls=self.parallel_tool_calls is not False,
            reasoning=None
            if reasoning is None
            else {"effort": reasoning.effort, "summary": reasoning.summary or reasoning.generate_summary},
            truncation=self.truncation or "disabled",
            top_logprobs=self.top_logprobs or 0,
            output_logprobs=self.output_logprobs,
            input=self.conversation_of_input().places,
        )

    @property
    def _instructions(self) -> list[ChatMessage]:
        return [] if self.instructions is None else [ChatMessage(role="system", content=self.instructions)]

    def turn(self, previous: str | None, earlier: tuple[ChatMessage, ...]) -> Turn:
        """Where the job's messages join the conversation: past its instructions, after the conversation
        `earlier` that the job `previous` (`previous_response_id`'s) ended."""
        return Turn(len(self._instructions), previous, earlier)

    def _chat_fields(self) -> dict[str, Any]:
        """The job's chat options: the tools in the chat's shape, the choice and the template's controls."""
        tools = self.function_tools
        choice = self.reported_tool_choice
        continues = self.continues_final_item
        if isinstance(choice, dict):
            job_choice: str | dict[str, Any] | None = {
                "type": "function",
                "function": {"name": choice["name"]},
            }
        else:
            job_choice = choice if tools else None  # without tools, none: the job's default
        return {
            "tools": [tool.chat_tool() for tool in tools] or None,
            "tool_choice": job_choice,
            "parallel_tool_calls": self.parallel_tool_calls,
            "reasoning_effort": None if self.reasoning is None else self.reasoning.effort,
            "include_reasoning": self.include_reasoning,
            "chat_template_kwargs": self.chat_template_kwargs,
            "add_generation_prompt": not continues,
            "continue_final_message": continues,
        }

    def job_request(self, max_tokens_limit: int) -> JobRequest:
        """The job: `instructions`, then this input (the conversation before it joins at `turn`).

        Without `max_output_tokens` the job gets the chat route's default, within the gateway's limit,
        which admission raises to what the context leaves; a value over the limit is admission's to
        refuse. `truncation: auto` lets the job drop the prompt's first tokens to fit the context, as
        vLLM's `truncate_prompt_tokens=-1`. Call it after `refuse_unsupported`.
        """
        fields = {
            "max_tokens": min(DEFAULT_MAX_TOKENS, max_tokens_limit)
            if self.max_output_tokens is None
            else self.max_output_tokens,
            **self.sampling_fields(),
            "structured_outputs": self._structured_outputs(),
            "logprobs": (self.top_logprobs or 0) if self.output_logprobs else None,
            "truncate_prompt_tokens": -1 if self.truncation == "auto" else None,
            "messages": [*self._instructions, *self.conversation_of_input().chat_messages()],
            "deadline": self.deadline,
            **self._chat_fields(),
        }
        fields = {name: value for name, value in fields.items() if value is not None}
        return job_request_of(fields, PARAMETERS)


PARAMETERS = {
    "max_tokens": "max_output_tokens",
    "messages": "input",
    "structured_outputs": "text.format",
    "logprobs": "top_logprobs",
    "truncate_prompt_tokens": "truncation",
    "reasoning_effort": "reasoning.effort",
}
"""The Responses parameter of each job field set under another name."""
