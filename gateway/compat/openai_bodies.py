"""OpenAI's completions and chat completions bodies, checked and turned into jobs. Pure, no I/O.

Bodies are checked as vLLM's OpenAI server checks them, with vLLM's own sampling options, tools and
chat template controls, in vLLM's words; what a job cannot do is refused with the parameter named.
Fields neither OpenAI's API nor vLLM's defines are accepted and ignored, as vLLM's request models
allow extra fields: `ignored_fields` names them for the route to say so. The answers are in
`openai_answers`.
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Mapping
from typing import Annotated, Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from gateway.compat.openai_answers import PromptEcho
from shared.chat import MAX_TOOL_CALLS, MAX_TOOLS, ToolCall, check_role_fields
from shared.errors import InvalidRequest
from shared.requests import (
    MAX_MESSAGES,
    MAX_PROMPT_CHARS,
    MAX_PROMPTS,
    MAX_STOP_CHARS,
    MAX_STOP_STRINGS,
    MAX_STOP_TOKEN_IDS,
    ChatMessage,
    Deadline,
    JobRequest,
    Text,
)

COMPLETIONS_PATH = "/v1/completions"
CHAT_COMPLETIONS_PATH = "/v1/chat/completions"

VLLM_SAMPLING_OPTIONS = frozenset(
    {
        "presence_penalty",
        "frequency_penalty",
        "repetition_penalty",
        "logit_bias",
        "min_p",
        "min_tokens",
        "ignore_eos",
        "stop_token_ids",
        "include_stop_str_in_output",
        "skip_special_tokens",
        "spaces_between_special_tokens",
        "truncate_prompt_tokens",
        "priority",
    }
)
STRUCTURED_CONSTRAINTS = frozenset({"json", "regex", "choice", "grammar", "json_object", "structural_tag"})
_GUIDED_GONE = (
    "vLLM has replaced guided_{0} by structured_outputs: give {{'structured_outputs': {{'{0}': ...}}}}"
)
"""Options with the same name and meaning in a body and in a job: carried over as they are."""

VLLM_OPTIONS_NOT_HONOURED: dict[str, object] = {
    "use_beam_search": False,
    "length_penalty": 1.0,
    "bad_words": [],
    "allowed_token_ids": None,
    "logprob_token_ids": None,
    "return_token_ids": False,
    "return_tokens_as_token_ids": False,
    "return_token_offsets": False,
    "return_prompt_text": False,
    "prompt_embeds": None,
    "mm_processor_kwargs": None,
    "media_io_kwargs": None,
    "vllm_xargs": None,
    "kv_transfer_params": None,
    "ec_transfer_params": None,
    "repetition_detection": None,
    "watermarking": None,
}
"""vLLM's own options that change what a request generates or answers, which jobs do not carry, and
their defaults: given otherwise, they are refused rather than ignored (an unknown field is ignored)."""

Refusal = tuple[bool, str, str]
"""(whether the option is refused, its parameter, why)"""

# Bounds that keep every value of a body finite and small; what a job accepts is checked
# afterwards, against the job's own bounds, and reported under the OpenAI parameter's name.
Integer = Annotated[int, Field(ge=-(2**63), le=2**64 - 1)]
Number = Annotated[float, Field(ge=-1e6, le=1e6, allow_inf_nan=False)]
Name = Annotated[Text, Field(max_length=256)]
PromptText = Annotated[Text, Field(max_length=MAX_PROMPT_CHARS)]
StopText = Annotated[Text, Field(max_length=MAX_STOP_CHARS)]
Objects = Annotated[list[Any], Field(max_length=128)]
TokenIds = Annotated[list[Integer], Field(max_length=MAX_PROMPT_CHARS)]
MAX_METADATA = 16  # OpenAI's limits: 16 pairs, keys of 64 characters, values of 512
MetadataKey = Annotated[Text, Field(max_length=64)]
MetadataValue = Annotated[Text, Field(max_length=512)]
Metadata = Annotated[dict[MetadataKey, MetadataValue], Field(max_length=MAX_METADATA)]


def job_request_of(fields: dict[str, Any], params: Mapping[str, str]) -> JobRequest:
    """The job, with a validation failure reported under the OpenAI name of the parameter."""
    try:
        return JobRequest.model_validate(fields)
    except ValidationError as exc:
        error = exc.errors()[0]
        param = params.get(str(error["loc"][0]), str(error["loc"][0])) if error["loc"] else None
        message = f"{param}: {error['msg']}" if param else error["msg"]
        raise InvalidRequest(message, param=param, code=error["type"]) from exc


def in_terms(exc: InvalidRequest, params: Mapping[str, str]) -> InvalidRequest:
    """A refusal of a job field (the gateway's limits), under the API's name of its parameter."""
    if exc.field is None:
        return exc
    param = params.get(exc.field, exc.field)
    return InvalidRequest(f"{param}: {exc.reason}", param=param, code="invalid_value")


def refuse(refusals: list[Refusal]) -> None:
    """`InvalidRequest` naming the first parameter refused, if any is."""
    for refused, param, reason in refusals:
        if refused:
            raise InvalidRequest(f"{param}: {reason}", param=param, code="unsupported_parameter")


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="allow")  # as vLLM's: taken and ignored

    include_usage: bool | None = False
    continuous_usage_stats: bool | None = False  # vLLM's: the usage so far on every chunk

    @property
    def continuous_usage(self) -> bool:
        """As vLLM: usage on every chunk only when usage is asked for at all."""
        return bool(self.include_usage and self.continuous_usage_stats)


class JsonSchemaFormat(BaseModel):
    model_config = ConfigDict(extra="allow")  # as vLLM's: taken and ignored

    name: Name
    description: Text | None = None
    schema_: dict[str, Any] | None = Field(None, alias="schema")
    strict: bool | None = None  # vLLM's grammars always hold the output to the schema


class ResponseFormat(BaseModel):
    """`response_format`: `json_object` and `json_schema` become a `structured_outputs` constraint."""

    model_config = ConfigDict(extra="allow")  # a structural tag's own fields, refused with it

    type: Literal["text", "json_object", "json_schema", "structural_tag"]
    json_schema: JsonSchemaFormat | None = None


class SamplingOptions(BaseModel):
    """The sampling options every OpenAI-compatible endpoint takes, OpenAI's and vLLM's, under their
    names; the job's bounds apply. Unknown parameters are refused (400), as OpenAI refuses them, unless
    a body says otherwise (completions and chat take them as vLLM does: `_Body`); null stands for the
    default wherever OpenAI's API allows it."""

    model_config = ConfigDict(extra="forbid")

    temperature: Number | None = None
    top_p: Number | None = None
    top_k: Integer | None = None  # vLLM's extension; -1 and 0 mean no limit there
    seed: Integer | None = None
    stop: StopText | Annotated[list[StopText], Field(max_length=MAX_STOP_STRINGS)] | None = None
    presence_penalty: Number | None = None
    frequency_penalty: Number | None = None
    logit_bias: Annotated[dict[Name, Number], Field(max_length=1024)] | None = None
    user: Name | None = None  # an end-user id for OpenAI's abuse monitoring: nothing to do here
    # vLLM's own sampling options, under its names.
    repetition_penalty: Number | None = None
    min_p: Number | None = None
    min_tokens: Integer | None = None
    ignore_eos: bool | None = None
    stop_token_ids: Annotated[list[Integer], Field(max_length=MAX_STOP_TOKEN_IDS)] | None = None
    include_stop_str_in_output: bool | None = None
    skip_special_tokens: bool | None = None
    spaces_between_special_tokens: bool | None = None
    truncate_prompt_tokens: Integer | None = None
    priority: Integer | None = None  # vLLM's: lower first; here also the order in the tenant's share

    def sampling_fields(self) -> dict[str, Any]:
        """These options as job fields (None where the job's default applies)."""
        return {
            "temperature": self.temperature,
            "top_p": self.top_p,
            "top_k": None if self.top_k in (-1, 0) else self.top_k,
            "seed": self.seed,
            "stop": self.stop,
            **self.model_dump(include=set(VLLM_SAMPLING_OPTIONS), exclude_none=True),
        }


def extra_fields(model: BaseModel, path: str = "") -> list[str]:
    """The names a body gave that its model does not define, its nested models' by their path
    (`stream_options.x`)."""
    names = [f"{path}{name}" for name in model.model_extra or {}]
    for name in type(model).model_fields:
        value = getattr(model, name)
        if isinstance(value, BaseModel):
            names += extra_fields(value, f"{path}{name}.")
    return names


class _Body(SamplingOptions):
    """What both endpoints take. Fields neither OpenAI nor vLLM defines are taken and ignored, as vLLM's
    request models take them (`ignored_fields`)."""

    model_config = ConfigDict(extra="allow")

    chat: ClassVar[bool]
    default_max_tokens: ClassVar[int]

    model: Name
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    max_tokens: Integer | None = None
    n: Integer | None = None
    response_format: ResponseFormat | None = None
    structured_outputs: dict[str, Any] | None = None  # the job checks it
    # vLLM's names before `structured_outputs`: 0.32 no longer reads them, so they would do nothing.
    guided_json: Any = None
    guided_regex: Any = None
    guided_choice: Any = None
    cache_salt: Name | None = None  # vLLM's: salts the engine's prefix cache
    prompt_logprobs: Integer | None = None  # vLLM's: the prompt tokens' logprobs, whole answers only
    deadline: Deadline | None = None  # streampool's: still queued then, the job fails unrun

    @property
    def ignored_fields(self) -> list[str]:
        """The fields given that neither OpenAI's API nor vLLM's defines: taken, and ignored."""
        return extra_fields(self)

    @property
    def fills_context(self) -> bool:
        """No maximum given on chat, whose default in vLLM is what the context leaves after the prompt
        (completions default to 16 tokens, as in vLLM and OpenAI)."""
        return self.chat and self._max_tokens()[1] is None

    @property
    def include_usage(self) -> bool:
        return self.stream_options is not None and bool(self.stream_options.include_usage)

    def _refusals(self) -> list[Refusal]:
        given = self.model_extra or {}
        return [
            *(
                (
                    given[name] not in (None, default),
                    name,
                    "vLLM's option is not supported by streampool's jobs",
                )
                for name, default in VLLM_OPTIONS_NOT_HONOURED.items()
                if name in given
            ),
            (
                given.get("truncation_side") == "right",
                "truncation_side",
                "only 'left' is supported: truncate_prompt_tokens keeps the prompt's last tokens",
            ),
            (
                given.get("add_special_tokens", not self.chat) is self.chat,
                "add_special_tokens",
                f"only {not self.chat} is supported on this endpoint: "
                + ("the chat template holds them" if self.chat else "a prompt is encoded with them"),
            ),
            (self.stream_options is not None and not self.stream, "stream_options", "needs stream=true"),
            *(
                (getattr(self, f"guided_{kind}") is not None, f"guided_{kind}", _GUIDED_GONE.format(kind))
                for kind in ("json", "regex", "choice")
            ),
            (
                self.response_format is not None and self.response_format.type == "structural_tag",
                "response_format",
                "structural tags (for tool calls) are not supported",
            ),
            (
                self.response_format is not None
                and self.response_format.type == "json_schema"
                and (
                    self.response_format.json_schema is None
                    or self.response_format.json_schema.schema_ is None
                ),
                "response_format",
                "type 'json_schema' needs json_schema.schema",
            ),
        ]

    def _prompt_logprobs_checks(self) -> None:
        """vLLM's checks of `prompt_logprobs`, in its words: a job's come with its first delta, which a
        stream's chunks have no place for."""
        asked = self.prompt_logprobs
        if asked is None:
            return
        if self.stream and (asked > 0 or asked == -1):
            raise InvalidRequest(
                "`prompt_logprobs` are not available when `stream=True`.",
                param="prompt_logprobs",
                code="invalid_value",
            )
        if asked < 0 and asked != -1:
            raise InvalidRequest(
                "`prompt_logprobs` must be a positive value or -1.",
                param="prompt_logprobs",
                code="invalid_value",
            )

    def _structured_outputs(self) -> dict[str, Any] | None:
        """`structured_outputs`, with `response_format`'s constraint in place of its own, as vLLM does."""
        kind = None if self.response_format is None else self.response_format.type
        if kind == "json_object":
            constraint: dict[str, Any] = {"json_object": True}
        elif kind == "json_schema" and self.response_format and self.response_format.json_schema:
            constraint = {"json": self.response_format.json_schema.schema_}
        else:
            return self.structured_outputs
        options = {
            name: value
            for name, value in (self.structured_outputs or {}).items()
            if name not in STRUCTURED_CONSTRAINTS
        }
        return {**options, **constraint}

    @property
    def echoed(self) -> str:
        """What goes before the answer's text: a chat's last message, with `echo`, as vLLM answers."""
        return ""

    @property
    def prompt_echo(self) -> PromptEcho:
        """Whether a completion gives its prompt back (`echo`), which its job's first delta carries."""
        return PromptEcho.none

    @property
    def role(self) -> str:
        """The role of a chat answer's message."""
        return "assistant"

    def _max_tokens(self) -> tuple[str, int | None]:
        """The parameter that sets the most tokens to generate, and its value."""
        return "max_tokens", self.max_tokens

    @abstractmethod
    def _input(self) -> dict[str, Any]:
        """The job fields that differ by endpoint: what to generate from, and logprobs."""

    def _parameter_names(self) -> dict[str, str]:
        """This endpoint's names of the job fields it sets under another name."""
        names = {"max_tokens": self._max_tokens()[0], "logprobs": "top_logprobs" if self.chat else "logprobs"}
        if self.response_format is not None and self.response_format.type != "text":
            names["structured_outputs"] = "response_format"  # its constraint is the job's
        return names

    def in_own_terms(self, exc: InvalidRequest) -> InvalidRequest:
        """A refusal of a job field (the gateway's limits), under this endpoint's parameter name."""
        return in_terms(exc, self._parameter_names())

    def job_request(self, max_tokens_limit: int) -> JobRequest:
        """The job this body asks for; `InvalidRequest` (naming the parameter) when it cannot be one.

        Without a `max_tokens` the job gets the endpoint's default, within the gateway's limit (chat's
        is then raised to what the context leaves: `fills_context`); a value over the limit is
        admission's to refuse.
        """
        refuse(self._refusals())
        self._prompt_logprobs_checks()
        max_tokens = self._max_tokens()[1]
        if max_tokens is None:
            max_tokens = min(self.default_max_tokens, max_tokens_limit)
        fields = {
            "max_tokens": max_tokens,
            "n": self.n,
            **self.sampling_fields(),
            "structured_outputs": self._structured_outputs(),
            "cache_salt": self.cache_salt,
            "prompt_logprobs": self.prompt_logprobs,
            "deadline": self.deadline,
            **self._input(),
        }
        fields = {name: value for name, value in fields.items() if value is not None}
        return job_request_of(fields, self._parameter_names())


class CompletionBody(_Body):
    """`POST /v1/completions`: a prompt (text or token ids), or a list of them, `n` choices each."""

    chat = False
    default_max_tokens = 16  # OpenAI's and vLLM's default for completions

    prompt: (
        PromptText
        | Annotated[list[PromptText], Field(max_length=MAX_PROMPTS)]
        | TokenIds
        | Annotated[list[TokenIds], Field(max_length=MAX_PROMPTS)]
    )
    logprobs: Integer | None = None
    echo: bool | None = None
    suffix: PromptText | None = None
    best_of: Integer | None = None

    def _refusals(self) -> list[Refusal]:
        return [
            *super()._refusals(),
            (bool(self.suffix), "suffix", "suffix is not supported"),
            (self.best_of not in (None, 1), "best_of", "only best_of=1 is supported"),
        ]

    def _parameter_names(self) -> dict[str, str]:
        return {**super()._parameter_names(), "prompt_token_ids": "prompt"}

    @property
    def prompt_echo(self) -> PromptEcho:
        if not self.echo:
            return PromptEcho.none
        return PromptEcho.alone if self.max_tokens == 0 else PromptEcho.before

    def _max_tokens(self) -> tuple[str, int | None]:
        """An echo of `max_tokens` 0 gives the prompt back alone: its job runs for one token, left out
        of the answer, as vLLM's does."""
        if self.prompt_echo is PromptEcho.alone:
            return "max_tokens", 1
        return super()._max_tokens()

    def _input(self) -> dict[str, Any]:
        """The prompt as the job takes it: texts as `prompt`, token ids as `prompt_token_ids`; a list of
        one prompt is that prompt. With `echo` the job gives its prompts back, and with `logprobs` their
        logprobs too, as vLLM asks its engine for them (`prompt_logprobs`, unless given)."""
        prompts: list[Any] = [self.prompt] if isinstance(self.prompt, str) else list(self.prompt)
        if prompts and isinstance(prompts[0], int):
            prompts = [prompts]  # the token ids of one prompt
        field = "prompt_token_ids" if prompts and isinstance(prompts[0], list) else "prompt"
        fields = {field: prompts[0] if len(prompts) == 1 else prompts, "logprobs": self.logprobs}
        if self.echo:
            fields["echo"] = True
            if self.prompt_logprobs is None and self.logprobs is not None:
                fields["prompt_logprobs"] = self.logprobs
        return fields


class ContentPart(BaseModel):
    """A part of a message's content; only text parts can go into a job."""

    model_config = ConfigDict(extra="allow")

    type: Name
    text: PromptText | None = None


class CalledFunction(BaseModel):
    name: Name
    arguments: PromptText


class MessageToolCall(BaseModel):
    """A call of an assistant message in the history, as OpenAI's client sends it back."""

    id: Name
    type: Literal["function"] = "function"
    function: CalledFunction


class Message(BaseModel):
    """A message of the chat. Keys no role has are ignored, as vLLM's message types ignore them."""

    model_config = ConfigDict(extra="ignore")

    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: PromptText | Annotated[list[ContentPart], Field(max_length=MAX_MESSAGES)] | None = None
    name: Name | None = None
    tool_calls: Annotated[list[MessageToolCall], Field(max_length=MAX_TOOL_CALLS)] | None = None
    tool_call_id: Name | None = None
    reasoning: PromptText | None = None

    @model_validator(mode="before")
    @classmethod
    def _reasoning_content_is_reasoning(cls, data: Any) -> Any:
        """vLLM still takes a message's reasoning under its old name, `reasoning_content`."""
        if isinstance(data, dict) and data.get("reasoning") is None and "reasoning_content" in data:
            data = {**data, "reasoning": data["reasoning_content"]}
        return data

    @field_validator("content")
    @classmethod
    def _text_only(cls, content: str | list[ContentPart] | None) -> str | list[ContentPart] | None:
        for part in content if isinstance(content, list) else []:
            if part.type != "text" or part.text is None:
                raise ValueError(f"only text content parts are supported, not {part.type!r}")
        return content

    @model_validator(mode="after")
    def _as_its_role_has_it(self) -> Message:
        check_role_fields(self.role, self.content, self.tool_calls)
        return self

    @property
    def text(self) -> str | None:
        """The content; text parts are joined by newlines, as vLLM joins them."""
        if self.content is None or isinstance(self.content, str):
            return self.content
        return "\n".join(part.text or "" for part in self.content)

    def job_message(self) -> ChatMessage:
        """As the chat template takes it: `developer`, OpenAI's new name for `system`, as `system`.
        What the job's message refuses (a call's empty name, say) is a 400 naming `messages`."""
        try:
            return ChatMessage(
                role="system" if self.role == "developer" else self.role,
                content=self.text,
                name=self.name,
                tool_calls=[ToolCall.model_validate(call.model_dump()) for call in self.tool_calls]
                if self.tool_calls is not None
                else None,
                tool_call_id=self.tool_call_id,
                reasoning=self.reasoning,
            )
        except ValidationError as exc:
            error = exc.errors()[0]
            where = ".".join(map(str, error["loc"]))
            raise InvalidRequest(f"messages: {where}: {error['msg']}", param="messages") from exc


class FunctionParam(BaseModel):
    name: Name
    description: PromptText | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class ToolParam(BaseModel):
    """A tool offered (`tools`); vLLM's own extras (`defer_loading`) are ignored."""

    type: Literal["function"] = "function"
    function: FunctionParam


ToolChoiceParam = Name | dict[str, Any]
"""`tool_choice` as given: checked as vLLM checks it (`ChatBody._tool_refusal`), then the job's."""
NAMED_CHOICE_USAGE = 'Correct usage: `{"type": "function", "function": {"name": "my_function"}}`'


class ChatBody(_Body):
    """`POST /v1/chat/completions`: messages rendered with the model's chat template, with the tools
    offered and the template's controls as vLLM takes them."""

    chat = True
    default_max_tokens = JobRequest.model_fields["max_tokens"].default

    messages: Annotated[list[Message], Field(max_length=MAX_MESSAGES)]
    max_completion_tokens: Integer | None = None
    logprobs: bool | None = None
    top_logprobs: Integer | None = None
    tools: Annotated[list[ToolParam], Field(max_length=MAX_TOOLS)] | None = None
    tool_choice: ToolChoiceParam | None = None
    parallel_tool_calls: bool | None = None
    echo: bool | None = None  # vLLM's: the last message's content, when it is the answer's role, first
    # vLLM's chat template controls, each the job's own.
    chat_template: PromptText | None = None
    chat_template_kwargs: Annotated[dict[Name, Any], Field(max_length=128)] | None = None
    add_generation_prompt: bool | None = None
    continue_final_message: bool | None = None
    documents: Objects | None = None
    reasoning_effort: Name | None = None
    include_reasoning: bool | None = None
    thinking_token_budget: Integer | None = None
    # OpenAI's stored completions: the completion is kept, with its metadata, for the retention period.
    store: bool | None = None
    metadata: Metadata | None = None

    def _refusals(self) -> list[Refusal]:
        return [
            *super()._refusals(),
            (bool(self.top_logprobs) and not self.logprobs, "top_logprobs", "needs logprobs=true"),
        ]

    def _vllm_checks(self) -> None:
        """vLLM's own checks of the tools and the template controls, in its words
        (`ChatCompletionRequest.check_tool_usage`, `check_generation_prompt`)."""
        if self.tools == []:
            raise InvalidRequest(
                "`tools` must not be an empty array. Either provide at least one tool or omit the field "
                "entirely.",
                param="tools",
                code="invalid_value",
            )
        if (refusal := self._tool_choice_refusal()) is not None:
            raise InvalidRequest(refusal[1], param=refusal[0], code="invalid_value")
        if self.continue_final_message and self.add_generation_prompt is not False:
            raise InvalidRequest(
                "Cannot set both `continue_final_message` and `add_generation_prompt` to True.",
                code="invalid_value",
            )
        constraint = any(
            (self.structured_outputs or {}).get(kind) is not None for kind in ("json", "regex", "choice")
        )
        if constraint and isinstance(self.tool_choice, dict):
            raise InvalidRequest(
                "You can only either use constraints for structured outputs or tools, not both.",
                code="invalid_value",
            )

    def _tool_choice_refusal(self) -> tuple[str, str] | None:
        """(parameter, vLLM's message) when `tool_choice` is not one vLLM takes with these tools."""
        choice = self.tool_choice
        if choice is None or choice == "none":
            return None
        if self.tools is None:
            return "tool_choice", "When using `tool_choice`, `tools` must be set."
        if isinstance(choice, str):
            if choice in ("auto", "required"):
                return None
            return (
                "tool_choice",
                f'Invalid value for `tool_choice`: {choice}! Only named tools, "none", "auto" or '
                '"required" are supported.',
            )
        function = choice.get("function")
        if not isinstance(function, dict):
            return (
                "tool_choice.function",
                f"Invalid value for `function`: `{function}` in `tool_choice`! {NAMED_CHOICE_USAGE}",
            )
        if "name" not in function:
            return (
                "tool_choice.function.name",
                f"Expected field `name` in `function` in `tool_choice`! {NAMED_CHOICE_USAGE}",
            )
        name = function["name"]
        if not isinstance(name, str) or not name:
            return (
                "tool_choice.function.name",
                f"Invalid `name` in `function`: `{name}` in `tool_choice`! {NAMED_CHOICE_USAGE}",
            )
        if name not in [tool.function.name for tool in self.tools]:
            return (
                "tool_choice",
                "The tool specified in `tool_choice` does not match any of the specified `tools`",
            )
        return None

    def job_request(self, max_tokens_limit: int) -> JobRequest:
        self._vllm_checks()
        return super().job_request(max_tokens_limit)

    def _max_tokens(self) -> tuple[str, int | None]:
        # As vLLM: the newer name wins when both are given.
        if self.max_completion_tokens is not None:
            return "max_completion_tokens", self.max_completion_tokens
        return super()._max_tokens()

    @property
    def role(self) -> str:
        """The role of the answer's message: the assistant's, or, where no new turn is opened
        (`add_generation_prompt` false), the last message's, as vLLM's answers say."""
        return "assistant" if self.add_generation_prompt is not False else self.messages[-1].role

    @property
    def echoed(self) -> str:
        """With `echo`, the last message's content when its role is the answer's: it goes before the
        answer's own, as vLLM answers."""
        last = self.messages[-1]
        return (last.text or "") if self.echo and last.role == self.role else ""

    def _input(self) -> dict[str, Any]:
        tool_choice = self.tool_choice
        if isinstance(tool_choice, dict):  # checked by `_tool_choice_refusal`: the job keeps its name
            tool_choice = {"type": "function", "function": {"name": tool_choice["function"]["name"]}}
        chat_fields = {
            "tools": None
            if self.tools is None
            else [tool.model_dump(exclude_none=True) for tool in self.tools],
            "tool_choice": tool_choice,
            **self.model_dump(
                include={
                    "parallel_tool_calls",
                    "chat_template",
                    "chat_template_kwargs",
                    "add_generation_prompt",
                    "continue_final_message",
                    "documents",
                    "reasoning_effort",
                    "include_reasoning",
                    "thinking_token_budget",
                }
            ),
        }
        return {
            "messages": [message.job_message() for message in self.messages],
            "logprobs": (self.top_logprobs or 0) if self.logprobs else None,
            **chat_fields,
        }
