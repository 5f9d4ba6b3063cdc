"""OpenAI's completions and chat completions answers, stream chunks and errors, from streampool's
jobs and events, in the shapes the `openai` package parses. Pure, no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel

from shared.events import DeltaEvent, DoneEvent, Event, TokenLogprob, Usage

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


ChoiceOutput = tuple[str, list[TokenLogprob] | None, str]
"""One choice of a whole answer: (text, logprobs when asked for, finish_reason)."""


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
        response = ChatCompletionResponse(
            **envelope,
            choices=[
                ChatChoice(
                    index=index,
                    message=AssistantMessage(content=text),
                    logprobs=answer.logprobs(logprobs),
                    finish_reason=finish_reason,
                )
                for index, (text, logprobs, finish_reason) in enumerate(choices)
            ],
        )
    else:
        response = CompletionResponse(
            **envelope,
            choices=[
                CompletionChoice(
                    index=index, text=text, logprobs=answer.logprobs(logprobs), finish_reason=finish_reason
                )
                for index, (text, logprobs, finish_reason) in enumerate(choices)
            ],
        )
    return response.model_dump()


class ChunkStream:
    """Turns one job's events, in order, into the chunks of one streamed answer.

    Nothing goes out before the first token (or the end): status events make no chunk, so that
    a client measures the job's time to first token, as on vLLM's server. Chat opens with the
    assistant's role, then content deltas; both kinds end with an empty delta carrying
    `finish_reason`, and, if asked for, a chunk with only `usage`. With `continuous_usage`
    every chunk carries the usage so far, as vLLM's `continuous_usage_stats`: the prompt's
    count is the gateway's own (`prompt_tokens`, 0 when it has no model card) until the end,
    where the worker's usage is given. A job of `n` choices streams each chunk with its choice's
    `index`: each choice opens, goes on and ends as one alone would, and usage adds all of them up.
    """

    def __init__(
        self,
        answer: Answer,
        include_usage: bool,
        continuous_usage: bool = False,
        prompt_tokens: int | None = None,
        echoed: str = "",
    ) -> None:
        self.answer = answer
        self.include_usage = include_usage
        self.continuous_usage = continuous_usage
        self.usage = Usage(prompt_tokens=prompt_tokens or 0, completion_tokens=0)
        self.echoed = echoed  # goes out before each choice's first text
        self.opened: set[int] = set()  # the choices with a chunk out
        self.text_offsets: dict[int, int] = {}  # per choice

    def _chunk(self, choices: list[dict[str, Any]], usage: Usage | None = None) -> dict[str, Any]:
        chunk = {
            **self.answer.envelope("chat.completion.chunk" if self.answer.chat else "text_completion"),
            "choices": choices,
        }
        if self.continuous_usage:
            chunk["usage"] = usage_object(usage or self.usage)
        elif self.include_usage:  # as OpenAI: present on every chunk, null but on the last
            chunk["usage"] = usage_object(usage) if usage else None
        return chunk

    def _choice(
        self,
        index: int,
        output: dict[str, Any],
        logprobs: dict[str, Any] | None = None,
        finish_reason: str | None = None,
    ) -> dict[str, Any]:
        return {"index": index, **output, "logprobs": logprobs, "finish_reason": finish_reason}

    def _text(self, text: str) -> dict[str, Any]:
        return {"delta": {"content": text} if text else {}} if self.answer.chat else {"text": text}

    def _open(self, index: int) -> tuple[list[dict[str, Any]], str]:
        """What goes before choice `index`'s first output: chat's role chunk, a completion's echo."""
        if index in self.opened:
            return [], ""
        self.opened.add(index)
        if not self.answer.chat:
            return [], self.echoed
        return [self._chunk([self._choice(index, {"delta": {"role": "assistant", "content": ""}})])], ""

    def feed(self, event: Event) -> list[dict[str, Any]]:
        """The chunks one event makes; each choice's first delta (or the end) of a chat opens it with
        the role. The end closes every choice with its `finish_reason`, in order."""
        if isinstance(event, DeltaEvent):
            chunks, echoed = self._open(event.index)
            completion_tokens = self.usage.completion_tokens + len(event.token_ids)
            self.usage = self.usage.model_copy(update={"completion_tokens": completion_tokens})
            offset = self.text_offsets.get(event.index, 0)
            logprobs = self.answer.logprobs(event.logprobs, offset)
            self.text_offsets[event.index] = offset + sum(len(lp.token) for lp in event.logprobs or [])
            chunks.append(self._chunk([self._choice(event.index, self._text(echoed + event.text), logprobs)]))
            return chunks
        if not isinstance(event, DoneEvent):
            return []
        self.usage, chunks = event.usage, []
        for index, reason in enumerate(event.finish_reasons or [event.finish_reason]):
            chunks += self._open(index)[0]
            chunks.append(self._chunk([self._choice(index, self._text(""), finish_reason=reason)]))
        if self.include_usage:
            chunks.append(self._chunk([], event.usage))
        return chunks
