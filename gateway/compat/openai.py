"""OpenAI's completions and chat completions, to and from streampool's jobs and events. Pure, no I/O.

Bodies are checked as vLLM's OpenAI server checks them, and what a job cannot do
(several choices, tools, penalties, ...) is refused with the parameter named, never
ignored. Answers and stream chunks have the shapes the `openai` package parses.
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Annotated, Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from shared.errors import BackendUnavailable, InvalidRequest, StreampoolError
from shared.events import DeltaEvent, DoneEvent, Event, TokenLogprob, Usage
from shared.requests import (
    MAX_MESSAGES,
    MAX_PROMPT_CHARS,
    MAX_STOP_CHARS,
    MAX_STOP_STRINGS,
    ChatMessage,
    JobRequest,
    Text,
)

COMPLETIONS_PATH = "/v1/completions"
CHAT_COMPLETIONS_PATH = "/v1/chat/completions"
PATHS = frozenset({COMPLETIONS_PATH, CHAT_COMPLETIONS_PATH})
MIN_LOGPROB = -9999.0  # JSON has no -inf; vLLM clamps the same way

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


class ModelNotFound(StreampoolError):
    error_type = "model_not_found"


def check_model(model: str, served: set[str]) -> None:
    """Only a model some live worker serves can be asked for (vLLM checks `model` the same way)."""
    if not served:
        raise BackendUnavailable("no worker has a live heartbeat")
    if model not in served:
        names = ", ".join(sorted(served))
        raise ModelNotFound(f"The model `{model}` does not exist; served: {names}", param="model")


def error_object(
    status: int, message: str, param: str | None = None, code: str | None = None
) -> dict[str, Any]:
    """OpenAI's error body; its `type` follows the status, as OpenAI's own errors do."""
    if status == 429:
        kind = "rate_limit_error"
    elif status >= 500:
        kind = "server_error"
    else:
        kind = "invalid_request_error"
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


def _job_request(fields: dict[str, Any], params: Mapping[str, str]) -> JobRequest:
    """The job, with a validation failure reported under the OpenAI name of the parameter."""
    try:
        return JobRequest.model_validate(fields)
    except ValidationError as exc:
        error = exc.errors()[0]
        param = params.get(str(error["loc"][0]), str(error["loc"][0])) if error["loc"] else None
        message = f"{param}: {error['msg']}" if param else error["msg"]
        raise InvalidRequest(message, param=param, code=error["type"]) from exc


class OpenAIError(BaseModel):
    message: str
    type: str
    param: str | None
    code: str | None


class OpenAIErrorBody(BaseModel):
    """Every error answer of the OpenAI-compatible routes."""

    error: OpenAIError


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")

    include_usage: bool = False


class _Body(BaseModel):
    """What both endpoints take. Unknown parameters are refused (400), as OpenAI refuses them;
    null stands for the default wherever OpenAI's API allows it."""

    model_config = ConfigDict(extra="forbid")

    chat: ClassVar[bool]
    default_max_tokens: ClassVar[int]

    model: Name
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    max_tokens: Integer | None = None
    temperature: Number | None = None
    top_p: Number | None = None
    top_k: Integer | None = None  # vLLM's extension; -1 and 0 mean no limit there
    seed: Integer | None = None
    stop: StopText | Annotated[list[StopText], Field(max_length=MAX_STOP_STRINGS)] | None = None
    n: Integer | None = None
    presence_penalty: Number | None = None
    frequency_penalty: Number | None = None
    logit_bias: Annotated[dict[Name, Number], Field(max_length=1024)] | None = None
    user: Name | None = None  # an end-user id for OpenAI's abuse monitoring: nothing to do here

    @property
    def include_usage(self) -> bool:
        return self.stream_options is not None and self.stream_options.include_usage

    def _refusals(self) -> list[Refusal]:
        return [
            (self.n not in (None, 1), "n", "only one choice per request (n=1) is supported"),
            (bool(self.presence_penalty), "presence_penalty", "penalties are not supported"),
            (bool(self.frequency_penalty), "frequency_penalty", "penalties are not supported"),
            (bool(self.logit_bias), "logit_bias", "logit_bias is not supported"),
            (self.stream_options is not None and not self.stream, "stream_options", "needs stream=true"),
        ]

    def _max_tokens(self) -> tuple[str, int | None]:
        """The parameter that sets the most tokens to generate, and its value."""
        return "max_tokens", self.max_tokens

    @abstractmethod
    def _input(self) -> dict[str, Any]:
        """The job fields that differ by endpoint: what to generate from, and logprobs."""

    def job_request(self, max_tokens_limit: int) -> JobRequest:
        """The job this body asks for; `InvalidRequest` (naming the parameter) when it cannot be one."""
        for refused, param, reason in self._refusals():
            if refused:
                raise InvalidRequest(f"{param}: {reason}", param=param, code="unsupported_parameter")
        max_tokens_param, max_tokens = self._max_tokens()
        if max_tokens is None:
            max_tokens = min(self.default_max_tokens, max_tokens_limit)
        elif max_tokens > max_tokens_limit:
            raise InvalidRequest(
                f"{max_tokens_param}: must be at most {max_tokens_limit}",
                param=max_tokens_param,
                code="invalid_value",
            )
        fields = {
            "max_tokens": max_tokens,
            "temperature": self.temperature,
            "top_p": self.top_p,
            "top_k": None if self.top_k in (-1, 0) else self.top_k,
            "seed": self.seed,
            "stop": self.stop,
            **self._input(),
        }
        params = {"max_tokens": max_tokens_param, "logprobs": "top_logprobs" if self.chat else "logprobs"}
        return _job_request({name: value for name, value in fields.items() if value is not None}, params)


class CompletionBody(_Body):
    """`POST /v1/completions`: one prompt, one choice."""

    chat = False
    default_max_tokens = 16  # OpenAI's and vLLM's default for completions

    prompt: (
        PromptText
        | Annotated[list[PromptText], Field(max_length=MAX_MESSAGES)]
        | TokenIds
        | Annotated[list[TokenIds], Field(max_length=MAX_MESSAGES)]
    )
    logprobs: Integer | None = None
    echo: bool | None = None
    suffix: PromptText | None = None
    best_of: Integer | None = None

    def _refusals(self) -> list[Refusal]:
        one_text = isinstance(self.prompt, str) or (len(self.prompt) == 1 and isinstance(self.prompt[0], str))
        return [
            *super()._refusals(),
            (not one_text, "prompt", "give one prompt as a string; token ids and batches are not supported"),
            (bool(self.echo), "echo", "echoing the prompt is not supported"),
            (bool(self.suffix), "suffix", "suffix is not supported"),
            (self.best_of not in (None, 1), "best_of", "only best_of=1 is supported"),
        ]

    def _input(self) -> dict[str, Any]:
        prompt = self.prompt if isinstance(self.prompt, str) else self.prompt[0]
        return {"prompt": prompt, "logprobs": self.logprobs}


class ContentPart(BaseModel):
    """A part of a message's content; only text parts can go into a job."""

    model_config = ConfigDict(extra="allow")

    type: Name
    text: PromptText | None = None


class Message(BaseModel):
    model_config = ConfigDict(extra="forbid")

    role: Literal["system", "developer", "user", "assistant"]
    content: PromptText | Annotated[list[ContentPart], Field(max_length=MAX_MESSAGES)]

    @field_validator("content")
    @classmethod
    def _text_only(cls, content: str | list[ContentPart]) -> str | list[ContentPart]:
        for part in content if isinstance(content, list) else []:
            if part.type != "text" or part.text is None:
                raise ValueError(f"only text content parts are supported, not {part.type!r}")
        return content

    @property
    def text(self) -> str:
        """The content; text parts are joined by newlines, as vLLM joins them."""
        if isinstance(self.content, str):
            return self.content
        return "\n".join(part.text or "" for part in self.content)

    def job_message(self) -> ChatMessage:
        """As the chat template takes it: `developer`, OpenAI's new name for `system`, as `system`."""
        return ChatMessage(role="system" if self.role == "developer" else self.role, content=self.text)


class ChatBody(_Body):
    """`POST /v1/chat/completions`: messages rendered with the model's chat template."""

    chat = True
    default_max_tokens = JobRequest.model_fields["max_tokens"].default

    messages: Annotated[list[Message], Field(max_length=MAX_MESSAGES)]
    max_completion_tokens: Integer | None = None
    logprobs: bool | None = None
    top_logprobs: Integer | None = None
    tools: Objects | None = None
    tool_choice: Name | dict[str, Any] | None = None
    functions: Objects | None = None
    function_call: Name | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None  # meaningless without tools
    response_format: dict[str, Any] | None = None

    def _refusals(self) -> list[Refusal]:
        structured = self.response_format is not None and self.response_format.get("type") != "text"
        return [
            *super()._refusals(),
            (bool(self.tools), "tools", "tool calling is not supported"),
            (self.tool_choice not in (None, "none"), "tool_choice", "tool calling is not supported"),
            (bool(self.functions), "functions", "function calling is not supported"),
            (self.function_call not in (None, "none"), "function_call", "function calling is not supported"),
            (structured, "response_format", "only {'type': 'text'} is supported"),
            (bool(self.top_logprobs) and not self.logprobs, "top_logprobs", "needs logprobs=true"),
        ]

    def _max_tokens(self) -> tuple[str, int | None]:
        # As vLLM: the newer name wins when both are given.
        if self.max_completion_tokens is not None:
            return "max_completion_tokens", self.max_completion_tokens
        return super()._max_tokens()

    def _input(self) -> dict[str, Any]:
        return {
            "messages": [message.job_message() for message in self.messages],
            "logprobs": (self.top_logprobs or 0) if self.logprobs else None,
        }


def usage_object(usage: Usage) -> dict[str, int]:
    return {
        "prompt_tokens": usage.prompt_tokens,
        "completion_tokens": usage.completion_tokens,
        "total_tokens": usage.total_tokens,
    }


def _clamped(logprob: float) -> float:
    return max(logprob, MIN_LOGPROB)


def _chat_token(token: str, logprob: float) -> dict[str, Any]:
    return {"token": token, "logprob": _clamped(logprob), "bytes": list(token.encode("utf-8", "replace"))}


def chat_logprobs(logprobs: list[TokenLogprob]) -> dict[str, Any]:
    """Chat's `logprobs`: per token its bytes and its `top_logprobs` alternatives."""
    return {
        "content": [
            {
                **_chat_token(lp.token, lp.logprob),
                "top_logprobs": [_chat_token(top.token, top.logprob) for top in lp.top_logprobs],
            }
            for lp in logprobs
        ]
    }


def completion_logprobs(logprobs: list[TokenLogprob], text_offset: int) -> dict[str, Any]:
    """The completions API's column-wise `logprobs`; offsets count characters from `text_offset`.

    As OpenAI says, `top_logprobs` always holds the sampled token, so it may have one more entry.
    """
    offsets, tops = [], []
    for lp in logprobs:
        offsets.append(text_offset)
        text_offset += len(lp.token)
        top = {alternative.token: _clamped(alternative.logprob) for alternative in lp.top_logprobs}
        top.setdefault(lp.token, _clamped(lp.logprob))
        tops.append(top)
    return {
        "tokens": [lp.token for lp in logprobs],
        "token_logprobs": [_clamped(lp.logprob) for lp in logprobs],
        "top_logprobs": tops,
        "text_offset": offsets,
    }


@dataclass(frozen=True)
class Answer:
    """What every response and chunk of one request carries: kind, id, time and model."""

    chat: bool
    job_id: str
    model: str
    created: int

    @property
    def id(self) -> str:
        return f"{'chatcmpl' if self.chat else 'cmpl'}-{self.job_id}"

    def logprobs(self, logprobs: list[TokenLogprob] | None, text_offset: int = 0) -> dict[str, Any] | None:
        if logprobs is None:
            return None
        return chat_logprobs(logprobs) if self.chat else completion_logprobs(logprobs, text_offset)

    def envelope(self, object_name: str) -> dict[str, Any]:
        return {"id": self.id, "object": object_name, "created": self.created, "model": self.model}


class UsageObject(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


class _Response(BaseModel):
    id: str
    created: int
    model: str
    usage: UsageObject


class CompletionChoice(BaseModel):
    index: int
    text: str
    logprobs: dict[str, Any] | None
    finish_reason: str


class CompletionResponse(_Response):
    """A whole answer of `/v1/completions` (`stream` false)."""

    object: Literal["text_completion"] = "text_completion"
    choices: list[CompletionChoice]


class AssistantMessage(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str


class ChatChoice(BaseModel):
    index: int
    message: AssistantMessage
    logprobs: dict[str, Any] | None
    finish_reason: str


class ChatCompletionResponse(_Response):
    """A whole answer of `/v1/chat/completions` (`stream` false)."""

    object: Literal["chat.completion"] = "chat.completion"
    choices: list[ChatChoice]


def completion(
    answer: Answer, text: str, logprobs: list[TokenLogprob] | None, finish_reason: str, usage: Usage
) -> dict[str, Any]:
    """A whole (non-streamed) answer, in the shape its documented model has."""
    envelope: dict[str, Any] = {
        "id": answer.id,
        "created": answer.created,
        "model": answer.model,
        "usage": usage_object(usage),
    }
    choice: dict[str, Any] = {
        "index": 0,
        "logprobs": answer.logprobs(logprobs),
        "finish_reason": finish_reason,
    }
    response: BaseModel
    if answer.chat:
        message = AssistantMessage(content=text)
        response = ChatCompletionResponse(**envelope, choices=[ChatChoice(**choice, message=message)])
    else:
        response = CompletionResponse(**envelope, choices=[CompletionChoice(**choice, text=text)])
    return response.model_dump()


class ChunkStream:
    """Turns one job's events, in order, into the chunks of one streamed answer.

    Chat opens with the assistant's role, then content deltas; both kinds end with an
    empty delta carrying `finish_reason`, and, if asked for, a chunk with only `usage`.
    """

    def __init__(self, answer: Answer, include_usage: bool) -> None:
        self.answer = answer
        self.include_usage = include_usage
        self.started = False
        self.text_offset = 0

    def _chunk(self, choices: list[dict[str, Any]], usage: Usage | None = None) -> dict[str, Any]:
        chunk = {
            **self.answer.envelope("chat.completion.chunk" if self.answer.chat else "text_completion"),
            "choices": choices,
        }
        if self.include_usage:  # as OpenAI: present on every chunk, null but on the last
            chunk["usage"] = usage_object(usage) if usage else None
        return chunk

    def _choice(
        self, output: dict[str, Any], logprobs: dict[str, Any] | None = None, finish_reason: str | None = None
    ) -> dict[str, Any]:
        return {"index": 0, **output, "logprobs": logprobs, "finish_reason": finish_reason}

    def _text(self, text: str) -> dict[str, Any]:
        return {"delta": {"content": text} if text else {}} if self.answer.chat else {"text": text}

    def feed(self, event: Event) -> list[dict[str, Any]]:
        """The chunks one event makes; status events make none (but the first opens a chat)."""
        chunks = []
        if not self.started and self.answer.chat:
            chunks.append(self._chunk([self._choice({"delta": {"role": "assistant", "content": ""}})]))
        self.started = True
        if isinstance(event, DeltaEvent):
            logprobs = self.answer.logprobs(event.logprobs, self.text_offset)
            self.text_offset += sum(len(lp.token) for lp in event.logprobs or [])
            chunks.append(self._chunk([self._choice(self._text(event.text), logprobs)]))
        elif isinstance(event, DoneEvent):
            chunks.append(self._chunk([self._choice(self._text(""), finish_reason=event.finish_reason)]))
            if self.include_usage:
                chunks.append(self._chunk([], event.usage))
        return chunks
