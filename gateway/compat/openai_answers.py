"""OpenAI's completions and chat completions answers, stream chunks and errors, from streampool's
jobs and events, in the shapes the `openai` package parses. Pure, no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Literal

from pydantic import BaseModel, Field

from shared.events import DeltaEvent, DoneEvent, Echo, Event, TokenLogprob, Usage

MIN_LOGPROB = -9999.0  # JSON has no -inf; vLLM clamps the same way


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


class OpenAIError(BaseModel):
    message: str
    type: str
    param: str | None
    code: str | None


class OpenAIErrorBody(BaseModel):
    """Every error answer of the OpenAI-compatible routes."""

    error: OpenAIError


def usage_object(usage: Usage) -> dict[str, int]:
    return {
        "prompt_tokens": usage.prompt_tokens,
        "completion_tokens": usage.completion_tokens,
        "total_tokens": usage.total_tokens,
    }


def clamped(logprob: float) -> float:
    return max(logprob, MIN_LOGPROB)


def chat_token(token: str, logprob: float) -> dict[str, Any]:
    return {"token": token, "logprob": clamped(logprob), "bytes": list(token.encode("utf-8", "replace"))}


def chat_logprobs(logprobs: list[TokenLogprob]) -> dict[str, Any]:
    """Chat's `logprobs`: per token its bytes and its `top_logprobs` alternatives."""
    return {
        "content": [
            {
                **chat_token(lp.token, lp.logprob),
                "top_logprobs": [chat_token(top.token, top.logprob) for top in lp.top_logprobs],
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
        top = {alternative.token: clamped(alternative.logprob) for alternative in lp.top_logprobs}
        top.setdefault(lp.token, clamped(lp.logprob))
        tops.append(top)
    return {
        "tokens": [lp.token for lp in logprobs],
        "token_logprobs": [clamped(lp.logprob) for lp in logprobs],
        "top_logprobs": tops,
        "text_offset": offsets,
    }


class PromptEcho(str, Enum):
    """Whether a completion gives its prompt back (`echo`): not at all, before its output, or `alone`
    (`max_tokens` 0, as vLLM answers it: the one token generated for it left out)."""

    none = "none"
    before = "before"
    alone = "alone"


def echo_logprobs(
    echo: Echo, prompt: list[TokenLogprob | None] | None, output: list[TokenLogprob], text_offset: int = 0
) -> dict[str, Any]:
    """`completion_logprobs` of a completion whose prompt is echoed, as vLLM gives them: the prompt's
    first token with none (a null logprob and alternatives), its other tokens' (`prompt_logprobs`),
    then the output's."""
    rest = [logprob for logprob in (prompt or [])[1:] if logprob is not None]
    after = completion_logprobs([*rest, *output], text_offset + len(echo.first_token))
    return {
        "tokens": [echo.first_token, *after["tokens"]],
        "token_logprobs": [None, *after["token_logprobs"]],
        "top_logprobs": [None, *after["top_logprobs"]],
        "text_offset": [text_offset, *after["text_offset"]],
    }


def prompt_logprobs_object(logprobs: list[TokenLogprob | None]) -> list[dict[str, Any] | None]:
    """vLLM's `prompt_logprobs`: per prompt token (null for the first), by token id, that token's and its
    alternatives' logprob, rank and text."""

    def entry(logprob: float, rank: int | None, token: str) -> dict[str, Any]:
        return {"logprob": clamped(logprob), "rank": rank, "decoded_token": token}

    return [
        None
        if lp is None
        else {
            str(lp.token_id): entry(lp.logprob, lp.rank, lp.token),
            **{
                str(top.token_id): entry(top.logprob, rank, top.token)
                for rank, top in enumerate(lp.top_logprobs, start=1)
                if top.token_id != lp.token_id
            },
        }
        for lp in logprobs
    ]


@dataclass(frozen=True)
class Answer:
    """What every response and chunk of one request carries: kind, id, time and model."""

    chat: bool
    job_id: str
    model: str
    created: int
    role: str = "assistant"  # a chat's answer's (vLLM's: the last message's, with no generation prompt)

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


StopReason = int | str | None
"""vLLM's `stop_reason`: the stop string or token id that ended a choice, null for any other end."""
PromptLogprobs = list[dict[str, Any] | None] | None


class CompletionChoice(BaseModel):
    index: int
    text: str
    logprobs: dict[str, Any] | None
    finish_reason: str
    stop_reason: StopReason = None
    prompt_logprobs: PromptLogprobs = None


class CompletionResponse(_Response):
    """A whole answer of `/v1/completions` (`stream` false)."""

    object: Literal["text_completion"] = "text_completion"
    choices: list[CompletionChoice]


class CalledFunctionObject(BaseModel):
    name: str
    arguments: str


class ToolCallObject(BaseModel):
    """A call of `message.tool_calls`: its id, and the function's name and JSON arguments."""

    id: str
    type: Literal["function"] = "function"
    function: CalledFunctionObject


def _no_calls(calls: list[ToolCallObject]) -> bool:
    return not calls


class AssistantMessage(BaseModel):
    """The answer's message, as vLLM gives it: `tool_calls` only when the model called tools, and
    `reasoning` (null unless the pool parses it out)."""

    role: str = "assistant"
    content: str | None
    tool_calls: list[ToolCallObject] = Field(default_factory=list, exclude_if=_no_calls)
    reasoning: str | None = None


class ChatChoice(BaseModel):
    index: int
    message: AssistantMessage
    logprobs: dict[str, Any] | None
    finish_reason: str
    stop_reason: StopReason = None


class ChatCompletionResponse(_Response):
    """A whole answer of `/v1/chat/completions` (`stream` false)."""

    object: Literal["chat.completion"] = "chat.completion"
    choices: list[ChatChoice]
    prompt_logprobs: PromptLogprobs = None  # vLLM's, when asked for


@dataclass
class ChoiceOutput:
    """One choice of a whole answer, as its job generated it. A chat's `content` is None where vLLM
    gives none (only tool calls or reasoning came)."""

    content: str | None
    logprobs: list[TokenLogprob] | None = None  # when asked for
    finish_reason: str = "stop"
    stop_reason: StopReason = None
    reasoning: str | None = None
    tool_calls: list[ToolCallObject] = field(default_factory=list)
    prompt_logprobs: list[TokenLogprob | None] | None = None  # when asked for
    # A completion's prompt given back before `content` (with `logprobs`, its tokens' before its own).
    echo: Echo | None = None


def completion(answer: Answer, choices: list[ChoiceOutput], usage: Usage) -> dict[str, Any]:
    """A whole (non-streamed) answer, with its choices in order, in the shape its documented model has."""
    envelope: dict[str, Any] = {
        "id": answer.id,
        "created": answer.created,
        "model": answer.model,
        "usage": usage_object(usage),
    }
    response: BaseModel
    if answer.chat:
        asked = choices[0].prompt_logprobs if choices else None
        response = ChatCompletionResponse(
            **envelope,
            choices=[
                ChatChoice(
                    index=index,
                    message=AssistantMessage(
                        role=answer.role,
                        content=choice.content,
                        tool_calls=choice.tool_calls,
                        reasoning=choice.reasoning,
                    ),
                    logprobs=answer.logprobs(choice.logprobs),
                    finish_reason=choice.finish_reason,
                    stop_reason=choice.stop_reason,
                )
                for index, choice in enumerate(choices)
            ],
            prompt_logprobs=None if asked is None else prompt_logprobs_object(asked),
        )
    else:
        response = CompletionResponse(
            **envelope,
            choices=[
                CompletionChoice(
                    index=index,
                    text=(choice.echo.text if choice.echo else "") + (choice.content or ""),
                    logprobs=answer.logprobs(choice.logprobs)
                    if choice.echo is None or choice.logprobs is None
                    else echo_logprobs(choice.echo, choice.prompt_logprobs, choice.logprobs),
                    finish_reason=choice.finish_reason,
                    stop_reason=choice.stop_reason,
                    prompt_logprobs=None
                    if choice.prompt_logprobs is None
                    else prompt_logprobs_object(choice.prompt_logprobs),
                )
                for index, choice in enumerate(choices)
            ],
        )
    return response.model_dump()


def chat_delta(event: DeltaEvent) -> dict[str, Any]:
    """A chat chunk's `delta`, with the parts of vLLM's `DeltaMessage` the event has, in its order."""
    delta: dict[str, Any] = {}
    if event.text:
        delta["content"] = event.text
    if event.reasoning:
        delta["reasoning"] = event.reasoning
    if event.tool_calls:
        delta["tool_calls"] = [call.model_dump() for call in event.tool_calls]
    return delta


class ChunkStream:
    """Turns one job's events, in order, into the chunks of one streamed answer, as vLLM streams them.

    Nothing goes out before the first token (or the end): status events make no chunk, so that
    a client measures the job's time to first token, as on vLLM's server. Chat opens with the
    answer's role (then, with `echo`, the echoed message), then deltas of content, reasoning and tool
    calls (a delta with none of them, whose tokens a parser held back as markup, makes no chunk); both
    kinds end with an empty delta carrying `finish_reason` and `stop_reason`. Chunks have no `usage`
    unless asked for: then a last chunk with only `usage`, or, with `continuous_usage` (vLLM's
    `continuous_usage_stats`), the usage so far on every chunk: the prompt's count is the gateway's own
    (`prompt_tokens`, 0 when it has no model card) until the end, where the worker's usage is given.
    A job of `n` choices streams each chunk with its choice's `index`: each choice opens, goes on and
    ends as one alone would, and usage adds all of them up. With `echo`, each choice opens with its
    prompt, which the first delta of the prompt's first choice carries.
    """

    def __init__(
        self,
        answer: Answer,
        include_usage: bool,
        continuous_usage: bool = False,
        prompt_tokens: int | None = None,
        echoed: str = "",
        prompt_echo: PromptEcho = PromptEcho.none,
        choices_per_prompt: int = 1,
    ) -> None:
        self.answer = answer
        self.include_usage = include_usage
        self.continuous_usage = continuous_usage
        self.usage = Usage(prompt_tokens=prompt_tokens or 0, completion_tokens=0)
        self.echoed = echoed  # goes out before each choice's first output
        self.prompt_echo = prompt_echo
        self.choices_per_prompt = choices_per_prompt  # the job's `n`
        # Each prompt given back, and its logprobs, by the index of its first choice, whose first delta
        # carries them.
        self.echoes: dict[int, Echo] = {}
        self.prompt_logprobs: dict[int, list[TokenLogprob | None]] = {}
        self.opened: set[int] = set()  # the choices with a chunk out
        self.text_offsets: dict[int, int] = {}  # per choice

    def _chunk(self, choices: list[dict[str, Any]], usage: Usage | None = None) -> dict[str, Any]:
        chunk = {
            **self.answer.envelope("chat.completion.chunk" if self.answer.chat else "text_completion"),
            "choices": choices,
        }
        if self.continuous_usage or usage is not None:
            chunk["usage"] = usage_object(usage or self.usage)
        return chunk

    def _choice(
        self,
        index: int,
        output: dict[str, Any],
        logprobs: dict[str, Any] | None = None,
        finish_reason: str | None = None,
    ) -> dict[str, Any]:
        choice = {"index": index, **output, "logprobs": logprobs, "finish_reason": finish_reason}
        if not self.answer.chat:
            choice["stop_reason"] = None  # a completion's chunks all have it; the last one's is set
        return choice

    def _open(self, index: int) -> tuple[list[dict[str, Any]], str]:
        """What goes before choice `index`'s first output: chat's role chunk and echo chunk, a
        completion's echo (the text to put before its first text)."""
        if index in self.opened:
            return [], ""
        self.opened.add(index)
        if not self.answer.chat:
            return [], self.echoed
        role = {"role": self.answer.role, "content": ""}
        chunks = [self._chunk([self._choice(index, {"delta": role})])]
        if self.echoed:
            chunks.append(self._chunk([self._choice(index, {"delta": {"content": self.echoed}})]))
        return chunks, ""

    def feed(self, event: Event) -> list[dict[str, Any]]:
        """The chunks one event makes; each choice's first delta (or the end) of a chat opens it with
        the role. The end closes every choice with its `finish_reason`, in order."""
        if isinstance(event, DeltaEvent):
            return self._delta(event)
        if not isinstance(event, DoneEvent):
            return []
        self.usage, chunks = event.usage, []
        stop_reasons = event.stop_reasons or []
        for index, reason in enumerate(event.finish_reasons or [event.finish_reason]):
            chunks += self._open(index)[0]
            end = self._choice(
                index, {"delta": {}} if self.answer.chat else {"text": ""}, finish_reason=reason
            )
            end["stop_reason"] = stop_reasons[index] if index < len(stop_reasons) else None
            chunks.append(self._chunk([end]))
        if self.include_usage:
            chunks.append(self._chunk([], event.usage))
        return chunks

    def _delta(self, event: DeltaEvent) -> list[dict[str, Any]]:
        if event.echo is not None:
            self.echoes[event.index] = event.echo
        if event.prompt_logprobs is not None:
            self.prompt_logprobs[event.index] = event.prompt_logprobs
        opening = event.index not in self.opened
        chunks, echoed = self._open(event.index)
        completion_tokens = self.usage.completion_tokens + len(event.token_ids)
        self.usage = self.usage.model_copy(update={"completion_tokens": completion_tokens})
        if not self.answer.chat:
            return [*chunks, *self._text(event, opening, echoed)]
        delta = chat_delta(event)
        logprobs = self.answer.logprobs(event.logprobs)
        if delta or logprobs is not None:
            chunks.append(self._chunk([self._choice(event.index, {"delta": delta}, logprobs)]))
        return chunks

    def _text(self, event: DeltaEvent, opening: bool, echoed: str) -> list[dict[str, Any]]:
        """A completion's chunk of `event`. Where the prompt is given back, its choice's first chunk
        opens with it (with `logprobs`, with its tokens' too); given back alone, that chunk is all."""
        alone = self.prompt_echo is PromptEcho.alone
        if alone and not opening:
            return []
        text = "" if alone else event.text
        logprobs = [] if alone and event.logprobs is not None else event.logprobs
        offset = self.text_offsets.get(event.index, 0)
        first = event.index - event.index % self.choices_per_prompt  # its prompt's first choice
        echo = self.echoes.get(first)
        if opening and echo is not None and self.prompt_echo is not PromptEcho.none:
            text = echo.text + text
            prompt = self.prompt_logprobs.get(first)
            shown = None if logprobs is None else echo_logprobs(echo, prompt, logprobs)
        else:
            text = echoed + text
            shown = self.answer.logprobs(logprobs, offset)
        if shown is not None and shown["tokens"]:
            self.text_offsets[event.index] = shown["text_offset"][-1] + len(shown["tokens"][-1])
        return [self._chunk([self._choice(event.index, {"text": text}, shown)])]


def list_object(data: list[dict[str, Any]], has_more: bool) -> dict[str, Any]:
    """A page of a listing, OpenAI's list shape; a client asks for the next one `after` its `last_id`."""
    return {
        "object": "list",
        "data": data,
        "first_id": data[0]["id"] if data else None,
        "last_id": data[-1]["id"] if data else None,
        "has_more": has_more,
    }


def item_list(items: list[dict[str, Any]], limit: int, ascending: bool, after: str | None) -> dict[str, Any]:
    """A page of a list of items (`input_items`, a stored chat completion's messages), OpenAI's list
    shape; `after` an item id (the page starts past it)."""
    ordered = items if ascending else items[::-1]
    ids = [item["id"] for item in ordered]
    start = ids.index(after) + 1 if after in ids else 0
    return list_object(ordered[start : start + limit], start + limit < len(ordered))
