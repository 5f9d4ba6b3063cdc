"""vLLM's tokens-in/tokens-out answers, whole and streamed, from a job's result and events. Pure, no I/O.

The shapes are vLLM's `GenerateTokensResponse` and `GenerateTokensStreamResponse` (`output_mode`
"tokens": token ids, logprobs by token id) and their text variants (`output_mode` "text": the text
too, logprobs with decoded tokens and their bytes, as chat's). Fields for what a text model served
here never reports (expert routing, sampling masks, weight versions, prompt logprobs, KV transfer)
are there, null, as vLLM's server writes them.
"""

from __future__ import annotations

from dataclasses import dataclass
from http import HTTPStatus
from typing import Any, Literal

from pydantic import BaseModel

from gateway.compat.openai_answers import chat_token, clamped, usage_object
from shared.events import DeltaEvent, DoneEvent, Event, TokenLogprob, Usage

VLLM_ERROR_TYPES = {400: "BadRequestError", 404: "NotFoundError", 422: "UnprocessableEntityError"}


def vllm_error(status: int, message: str, param: str | None = None) -> dict[str, Any]:
    """vLLM's error body (`ErrorResponse`): its `code` is the HTTP status, its `type` the error's class."""
    kind = VLLM_ERROR_TYPES.get(status) or (
        "InternalServerError" if status >= 500 else HTTPStatus(status).phrase
    )
    return {"error": {"message": message, "type": kind, "param": param, "code": status}}


class VllmError(BaseModel):
    message: str
    type: str
    param: str | None
    code: int


class VllmErrorBody(BaseModel):
    """Every error answer of vLLM's scale-out routes."""

    error: VllmError


Candidate = tuple[int, str, float, int | None]
"""One (token id, token, logprob, rank) of a position's logprobs."""
WholeChoice = tuple[list[int], str, list[TokenLogprob], str, int | str | None]
"""One choice of a whole answer: (token ids, text, logprobs, finish_reason, stop_reason)."""


def candidates(logprob: TokenLogprob, wanted: int) -> list[Candidate]:
    """A position's logprobs in vLLM's order: the sampled token first, then the likeliest others,
    `wanted` in all (at least one)."""
    sampled = (logprob.token_id, logprob.token, logprob.logprob, logprob.rank)
    others = [
        (top.token_id, top.token, top.logprob, rank)
        for rank, top in enumerate(logprob.top_logprobs, start=1)
        if top.token_id != logprob.token_id
    ]
    return [sampled, *others][: max(wanted, 1)]


def _token_entry(candidate: Candidate) -> dict[str, Any]:
    token_id, _, logprob, rank = candidate
    return {"token_id": token_id, "logprob": clamped(logprob), "rank": rank or None}


def tokens_logprobs(logprobs: list[TokenLogprob], wanted: int) -> dict[str, Any]:
    """`output_mode` "tokens": each position's sampled token and candidates by id, with their ranks."""
    content = []
    for position in logprobs:
        sampled, *_ = ranked = candidates(position, wanted)
        content.append({**_token_entry(sampled), "top_logprobs": [_token_entry(each) for each in ranked]})
    return {"content": content}


def text_logprobs(logprobs: list[TokenLogprob], wanted: int) -> dict[str, Any]:
    """`output_mode` "text": as chat's logprobs, the candidates in vLLM's order."""
    content = []
    for position in logprobs:
        ranked = candidates(position, wanted)
        content.append(
            {
                **chat_token(position.token, position.logprob),
                "top_logprobs": [chat_token(token, logprob) for _, token, logprob, _ in ranked],
            }
        )
    return {"content": content}


class GenerateUsage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


class TokenCandidate(BaseModel):
    token_id: int
    logprob: float
    rank: int | None


class TokenPosition(TokenCandidate):
    top_logprobs: list[TokenCandidate]


class TokensLogprobs(BaseModel):
    content: list[TokenPosition] | None


class TextCandidate(BaseModel):
    token: str
    logprob: float
    bytes: list[int] | None


class TextPosition(TextCandidate):
    top_logprobs: list[TextCandidate]


class TextLogprobs(BaseModel):
    content: list[TextPosition] | None


class _Choice(BaseModel):
    index: int
    finish_reason: str | None
    stop_reason: int | str | None  # the stop string or token id that ended the choice
    token_ids: list[int] | None
    routed_experts: None = None
    sampling_mask: None = None
    weight_versions: None = None


class TokensChoice(_Choice):
    logprobs: TokensLogprobs | None


class TextChoice(_Choice):
    text: str
    logprobs: TextLogprobs | None


class _Response(BaseModel):
    request_id: str
    model: str
    created: int
    usage: GenerateUsage
    prompt_logprobs: None = None
    prompt_token_id_logprobs: None = None
    prompt_token_ids: list[int] | None
    mm_placeholders: None = None
    metrics: None = None
    kv_transfer_params: None = None
    ec_transfer_params: None = None


class GenerateTokensResponse(_Response):
    """A whole answer with `output_mode` "tokens"."""

    output_mode: Literal["tokens"] = "tokens"
    choices: list[TokensChoice]


class GenerateTextResponse(_Response):
    """A whole answer with `output_mode` "text"."""

    output_mode: Literal["text"] = "text"
    choices: list[TextChoice]


@dataclass(frozen=True)
class GenerateAnswer:
    """What every answer and chunk of one request carries, and how its choices are written."""

    request_id: str
    model: str
    created: int
    text: bool  # `output_mode` "text"
    logprobs: int | None  # the candidates asked for per position; None: no logprobs
    prompt_token_ids: list[int] | None  # given back when the request set `return_token_ids`

    @property
    def output_mode(self) -> str:
        return "text" if self.text else "tokens"

    def choice(
        self,
        index: int,
        token_ids: list[int],
        text: str,
        logprobs: list[TokenLogprob] | None,
        finish_reason: str | None = None,
        stop_reason: int | str | None = None,
    ) -> dict[str, Any]:
        """One choice, or one chunk's part of it, with its fields in vLLM's order."""
        choice: dict[str, Any] = {
            "index": index,
            "finish_reason": finish_reason,
            "stop_reason": stop_reason,
            "token_ids": token_ids,
            "routed_experts": None,
            "sampling_mask": None,
            "weight_versions": None,
        }
        if self.text:
            choice["text"] = text
        choice["logprobs"] = self._logprobs(logprobs)
        return choice

    def _logprobs(self, logprobs: list[TokenLogprob] | None) -> dict[str, Any] | None:
        if self.logprobs is None:
            return None
        convert = text_logprobs if self.text else tokens_logprobs
        return convert(logprobs or [], self.logprobs)

    def whole(self, choices: list[WholeChoice], usage: Usage) -> dict[str, Any]:
        """The answer of a request that did not stream, its choices in order, in the shape its
        documented model has."""
        response_model = GenerateTextResponse if self.text else GenerateTokensResponse
        response = response_model.model_validate(
            {
                "request_id": self.request_id,
                "model": self.model,
                "created": self.created,
                "usage": usage_object(usage),
                "prompt_token_ids": self.prompt_token_ids,
                "choices": [self.choice(index, *choice) for index, choice in enumerate(choices)],
            }
        )
        return response.model_dump()


class GenerateChunks:
    """Turns one job's events, in order, into the chunks of one streamed answer, as vLLM's server
    streams them: a chunk per delta of a choice, carrying its `index`; the prompt's ids on the first
    chunk when asked for; each choice's end as a chunk of no tokens with its `finish_reason` (vLLM's
    server sends it with the last tokens, which streampool's events carry apart); then, if asked for,
    a chunk of `usage` alone. With `continuous_usage` every chunk carries the prompt's tokens and its
    choice's so far, as vLLM's `continuous_usage_stats`."""

    def __init__(
        self, answer: GenerateAnswer, include_usage: bool, continuous_usage: bool, prompt_tokens: int
    ) -> None:
        self.answer = answer
        self.include_usage = include_usage
        self.continuous_usage = continuous_usage
        self.prompt_tokens = prompt_tokens
        self.generated: dict[int, int] = {}  # tokens so far, per choice
        self.prompt_ids_sent = answer.prompt_token_ids is None

    def _chunk(self, choice: dict[str, Any]) -> dict[str, Any]:
        chunk: dict[str, Any] = {"request_id": self.answer.request_id, "usage": None}
        if self.continuous_usage:
            generated = Usage(
                prompt_tokens=self.prompt_tokens, completion_tokens=self.generated[choice["index"]]
            )
            chunk["usage"] = usage_object(generated)
        if not self.prompt_ids_sent:
            chunk["prompt_token_ids"], self.prompt_ids_sent = self.answer.prompt_token_ids, True
        chunk["output_mode"] = self.answer.output_mode
        chunk["choices"] = [choice]
        return chunk

    def feed(self, event: Event) -> list[dict[str, Any]]:
        """The chunks one event makes."""
        if isinstance(event, DeltaEvent):
            self.generated[event.index] = self.generated.get(event.index, 0) + len(event.token_ids)
            choice = self.answer.choice(event.index, event.token_ids, event.text, event.logprobs)
            return [self._chunk(choice)]
        if not isinstance(event, DoneEvent):
            return []
        chunks = []
        stop_reasons = event.stop_reasons or []
        for index, reason in enumerate(event.finish_reasons or [event.finish_reason]):
            self.generated.setdefault(index, 0)
            stop_reason = stop_reasons[index] if index < len(stop_reasons) else None
            chunks.append(self._chunk(self.answer.choice(index, [], "", [], reason, stop_reason)))
        if self.include_usage:
            chunks.append(
                {
                    "request_id": self.answer.request_id,
                    "usage": usage_object(event.usage),
                    "output_mode": self.answer.output_mode,
                    "choices": [],
                }
            )
        return chunks
