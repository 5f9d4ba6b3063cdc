"""text-generation-inference's `/generate`, `/generate_stream` and `/info`, to and from jobs and events.

Pure, no I/O. What a job cannot do (penalties, grammars, truncation, prompt logprobs, ...)
is refused with the parameter named, never ignored. Answers and stream events have the
shapes `huggingface_hub.InferenceClient.text_generation` parses.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, AsyncIterator
from typing import Annotated, Any, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from shared.errors import InvalidRequest
from shared.events import CancelledEvent, DeltaEvent, DoneEvent, ErrorEvent, Event, TokenLogprob
from shared.requests import MAX_PROMPT_CHARS, MAX_STOP_CHARS, MAX_STOP_STRINGS, Deadline, JobRequest, Text

DEFAULT_MAX_NEW_TOKENS = 100  # TGI's default
ROUTER = "streampool"
UNKNOWN_DTYPE = "unknown"  # /info's dtype while no serving worker's heartbeat says it

FinishReason = Literal["length", "eos_token", "stop_sequence"]

# TGI's error types and statuses for streampool's; anything else failed during generation.
ERRORS: dict[str, tuple[str, int]] = {
    "validation": ("validation", 422),
    "prompt_too_long": ("validation", 422),  # TGI checks the input length before it generates
    "overloaded": ("overloaded", 429),
    "rate_limited": ("overloaded", 429),  # TGI has one type for every 429
    "unavailable": ("unavailable", 503),
    "cancelled": ("incomplete_generation", 500),  # TGI's name for a stream that ended early
    # No worker started the job by its deadline: the queue was too busy (or had no worker), as TGI's
    # "overloaded" says, with the gateway's timeout status.
    "deadline_exceeded": ("overloaded", 504),
}
GENERATION_ERROR = ("generation", 424)

# Job fields under the names a TGI client used for them.
PARAMETER_NAMES = {"prompt": "inputs", "max_tokens": "parameters.max_new_tokens"}

# Bounds that keep every value finite and small; what a job accepts is checked afterwards.
Integer = Annotated[int, Field(ge=-(2**63), le=2**64 - 1)]
Number = Annotated[float, Field(ge=-1e6, le=1e6, allow_inf_nan=False)]
StopText = Annotated[Text, Field(max_length=MAX_STOP_CHARS)]


class Parameters(BaseModel):
    """TGI's `parameters`; unknown ones are refused, and so are values a job cannot honour."""

    model_config = ConfigDict(extra="forbid")

    max_new_tokens: Integer | None = Field(default=None, ge=1)
    temperature: Number | None = Field(default=None, ge=0)
    top_p: Number | None = Field(default=None, gt=0, le=1)
    top_k: Integer | None = Field(default=None, ge=1)
    seed: Integer | None = Field(default=None, ge=0)
    stop: list[StopText] = Field(default=[], max_length=MAX_STOP_STRINGS)
    do_sample: bool = False
    details: bool = False
    decoder_input_details: bool = False
    return_full_text: bool | None = None
    truncate: Integer | None = None
    repetition_penalty: Number | None = None
    frequency_penalty: Number | None = None
    typical_p: Number | None = None
    watermark: bool = False
    grammar: dict[str, Any] | None = None
    best_of: Integer | None = None
    top_n_tokens: Integer | None = None
    adapter_id: Annotated[Text, Field(max_length=256)] | None = None

    @property
    def sampling(self) -> bool:
        """As TGI's server decides: sampling when asked for or when a sampling parameter is set."""
        return (
            self.do_sample
            or self.temperature not in (None, 1.0)
            or self.top_k is not None
            or self.top_p not in (None, 1.0)
        )

    @property
    def job_temperature(self) -> float:
        """Greedy decoding is temperature 0 for vLLM."""
        if not self.sampling:
            return 0.0
        return 1.0 if self.temperature is None else self.temperature

    @property
    def reported_seed(self) -> int | None:
        """The seed TGI reports: the one sampling used; none for greedy decoding (or when none was given)."""
        return self.seed if self.sampling else None

    def refusals(self) -> list[tuple[bool, str, str]]:
        """(refused, parameter, why) for every parameter a job has no equivalent of."""
        return [
            (self.decoder_input_details, "decoder_input_details", "prompt token logprobs are not supported"),
            (
                self.truncate is not None,
                "truncate",
                # The gateway counts a prompt's tokens (to refuse one too long), but cuts none.
                "input truncation is not supported; shorten the input",
            ),
            (self.repetition_penalty not in (None, 1.0), "repetition_penalty", "penalties are not supported"),
            (self.frequency_penalty not in (None, 0.0), "frequency_penalty", "penalties are not supported"),
            (self.typical_p not in (None, 1.0), "typical_p", "typical sampling is not supported"),
            (self.watermark, "watermark", "watermarking is not supported"),
            (self.grammar is not None, "grammar", "grammar-constrained generation is not supported"),
            (self.best_of not in (None, 1), "best_of", "only best_of=1 is supported"),
            (self.top_n_tokens not in (None, 0), "top_n_tokens", "top tokens are not supported"),
            (self.adapter_id is not None, "adapter_id", "adapters are not supported"),
        ]


class GenerateRequest(BaseModel):
    """The body of every TGI generation route; only `POST /` reads `stream`."""

    model_config = ConfigDict(extra="forbid")

    inputs: Text = Field(min_length=1, max_length=MAX_PROMPT_CHARS)
    parameters: Parameters = Parameters()
    stream: bool = False
    deadline: Deadline | None = None  # streampool's: still queued then, the job fails unrun

    def job_request(self, max_new_tokens_limit: int, *, stream: bool) -> JobRequest:
        """The job this body asks for; `InvalidRequest`, naming the parameter, when it cannot be one.

        Token logprobs are asked for whenever tokens are shown (stream events, `details`):
        they carry each token's text.
        """
        params = self.parameters
        for refused, name, reason in params.refusals():
            if refused:
                raise InvalidRequest(f"parameters.{name}: {reason}", param=name)
        # A value over the limit is admission's to refuse; without one, the default stays within it.
        max_new_tokens = params.max_new_tokens or min(DEFAULT_MAX_NEW_TOKENS, max_new_tokens_limit)
        fields = {
            "prompt": self.inputs,
            "max_tokens": max_new_tokens,
            "temperature": params.job_temperature,
            "top_p": params.top_p,
            "top_k": params.top_k,
            "seed": params.seed,
            "stop": params.stop or None,
            "logprobs": 0 if stream or params.details else None,
            "deadline": self.deadline,
        }
        try:
            return JobRequest.model_validate(
                {name: value for name, value in fields.items() if value is not None}
            )
        except ValidationError as exc:
            error = exc.errors()[0]
            field = str(error["loc"][0]) if error["loc"] else ""
            name = PARAMETER_NAMES.get(field, f"parameters.{field}") if field else ""
            raise InvalidRequest(f"{name}: {error['msg']}" if name else error["msg"], param=name) from exc

    @staticmethod
    def in_own_terms(exc: InvalidRequest) -> InvalidRequest:
        """A refusal of a job field (the gateway's limits), under TGI's name for the parameter."""
        if exc.field is None:
            return exc
        name = PARAMETER_NAMES.get(exc.field, f"parameters.{exc.field}")
        return InvalidRequest(f"{name}: {exc.reason}", param=name.removeprefix("parameters."))

    def shown_text(self, text: str) -> str:
        """The generated text as TGI answers it: after the prompt when `return_full_text` is set."""
        return self.inputs + text if self.parameters.return_full_text else text


class Token(BaseModel):
    id: int
    text: str
    logprob: float | None
    special: bool


class ErrorResponse(BaseModel):
    error: str
    error_type: str


class StreamDetails(BaseModel):
    finish_reason: FinishReason
    generated_tokens: int
    input_length: int
    seed: int | None


class StreamResponse(BaseModel):
    index: int
    token: Token
    generated_text: str | None = None
    details: StreamDetails | None = None


class Details(BaseModel):
    finish_reason: FinishReason
    generated_tokens: int
    seed: int | None
    prefill: list[Token] = []  # prompt tokens are only listed with decoder_input_details, refused here
    tokens: list[Token]


class GenerateResponse(BaseModel):
    generated_text: str


class DetailedResponse(GenerateResponse):
    details: Details


class Info(BaseModel):
    """`GET /info`: what TGI says about its model and limits, here from live workers' heartbeats
    (model, dtype, context) and the gateway's settings (its limits)."""

    model_id: str
    model_sha: str | None = None
    model_dtype: str
    model_device_type: str | None = None  # worker heartbeats do not say
    model_pipeline_tag: str = "text-generation"
    max_concurrent_requests: int | None
    max_best_of: int = 1
    max_stop_sequences: int = MAX_STOP_STRINGS
    max_input_tokens: int
    max_input_length: int
    max_total_tokens: int
    max_new_tokens: int
    max_client_batch_size: int = 1
    validation_workers: int = 0  # bodies are checked in the gateway's own event loop
    router: str = ROUTER
    version: str
    sha: str | None = None
    docker_label: str | None = None
    workers: int


def error(message: str, error_type: str) -> tuple[ErrorResponse, int]:
    """TGI's error body and status for a streampool error."""
    tgi_type, status = ERRORS.get(error_type, GENERATION_ERROR)
    return ErrorResponse(error=message, error_type=tgi_type), status


def token_texts(text: str, pieces: list[str]) -> list[str]:
    """Texts for tokens decoded one by one as `pieces` that join to exactly `text`.

    A piece is kept while the pieces so far spell the start of `text`; from the first that
    does not (a special token, a stop string cut off, a character split across tokens), the
    rest of `text` goes to the last token.
    """
    if not pieces:
        return []
    kept: list[str] = []
    end = 0
    for piece in pieces[:-1]:
        if not text.startswith(piece, end):
            break
        kept.append(piece)
        end += len(piece)
    return [*kept, *[""] * (len(pieces) - 1 - len(kept)), text[end:]]


def finish_reason(reason: str, text: str, pieces: str, stop: list[str]) -> FinishReason:
    """TGI's finish reason for vLLM's, which says `stop` for both a stop string and the end-of-sequence token.

    vLLM cuts a matched stop string off the text but not off the tokens: the tokens' own text
    going on past the text with a stop string tells the two apart.
    """
    if reason == "length":
        return "length"
    leftover = pieces[len(text) :] if pieces.startswith(text) else ""
    if any(leftover.startswith(string) for string in stop):
        return "stop_sequence"
    return "eos_token"


def _tokens(text: str, logprobs: list[TokenLogprob]) -> list[Token]:
    texts = token_texts(text, [lp.token for lp in logprobs])
    return [
        Token(id=lp.token_id, text=piece, logprob=lp.logprob, special=False)
        for lp, piece in zip(logprobs, texts, strict=True)
    ]


def generated(
    body: GenerateRequest, text: str, logprobs: list[TokenLogprob], reason: str, generated_tokens: int
) -> GenerateResponse:
    """A whole answer of `/generate`, with `details` when they were asked for."""
    if not body.parameters.details:
        return GenerateResponse(generated_text=body.shown_text(text))
    pieces = "".join(lp.token for lp in logprobs)
    tgi_reason = finish_reason(reason, text, pieces, body.parameters.stop)
    tokens = _tokens(text, logprobs)
    if tokens and tgi_reason == "eos_token":
        tokens[-1].special = True  # vLLM counts the end-of-sequence token among the generated ones
    details = Details(
        finish_reason=tgi_reason,
        generated_tokens=generated_tokens,
        seed=body.parameters.reported_seed,
        tokens=tokens,
    )
    return DetailedResponse(generated_text=body.shown_text(text), details=details)


class TokenStream:
    """One job's events, in order, as the events of a TGI stream: one per token.

    TGI's last event carries the last token with the whole text and the details, so the
    newest token is held back until the next event shows whether more follow. `flush`
    sends it on when the caller knows that no terminal event is at hand yet.
    """

    def __init__(self, body: GenerateRequest) -> None:
        self.body = body
        self.index = 0
        self.text = ""
        self.pieces = ""
        self.unassigned = ""  # text that came without tokens: it goes with the next one
        self.held: Token | None = None

    def _event(self, token: Token, **final: Any) -> StreamResponse:
        self.index += 1
        return StreamResponse(index=self.index, token=token, **final)

    def flush(self) -> list[StreamResponse | ErrorResponse]:
        """The held-back token, as a token that is not the last."""
        if self.held is None:
            return []
        held, self.held = self.held, None
        return [self._event(held)]

    def feed(self, event: Event) -> list[StreamResponse | ErrorResponse]:
        """The stream events one job event makes; a status event makes none."""
        if isinstance(event, DeltaEvent):
            return self._delta(event)
        if isinstance(event, DoneEvent):
            return [self._done(event)]
        if isinstance(event, ErrorEvent):
            return [*self.flush(), error(event.message, event.code)[0]]
        if isinstance(event, CancelledEvent):
            return [*self.flush(), error("the job was cancelled", "cancelled")[0]]
        return []

    def _delta(self, delta: DeltaEvent) -> list[StreamResponse | ErrorResponse]:
        self.text += delta.text
        logprobs = delta.logprobs or []
        self.pieces += "".join(lp.token for lp in logprobs)
        if not logprobs:
            self.unassigned += delta.text
            return []
        tokens = _tokens(self.unassigned + delta.text, logprobs)
        self.unassigned = ""
        events = self.flush()
        self.held = tokens.pop()
        return [*events, *(self._event(token) for token in tokens)]

    def _done(self, done: DoneEvent) -> StreamResponse:
        params = self.body.parameters
        reason = finish_reason(done.finish_reason, self.text, self.pieces, params.stop)
        # Without a held token (the last delta was read apart from `done`, which the worker
        # appends with it) the stream still ends TGI's way, with an empty special token.
        last = self.held or Token(id=0, text="", logprob=None, special=True)
        self.held = None
        last.text += self.unassigned
        last.special = last.special or reason == "eos_token"
        details = StreamDetails(
            finish_reason=reason,
            generated_tokens=done.usage.completion_tokens,
            input_length=done.usage.prompt_tokens,
            seed=params.reported_seed,
        )
        return self._event(
            last, generated_text=self.body.shown_text(self.text), details=details if params.details else None
        )


T = TypeVar("T")


async def with_lookahead(items: AsyncIterator[T]) -> AsyncGenerator[tuple[T, bool], None]:
    """Each item, and whether the next one is already at hand (read in the same batch).

    The next item is asked for at once and given one turn of the event loop: an item read
    with the previous one is ready by then; one still to come from Redis is not. Closing
    this early cancels the pending read, which ends `items` as a departed reader does.
    """
    upcoming = asyncio.ensure_future(anext(items))
    try:
        while True:
            try:
                item = await upcoming
            except StopAsyncIteration:
                return
            upcoming = asyncio.ensure_future(anext(items))
            await asyncio.sleep(0)
            yield item, upcoming.done()
    finally:
        upcoming.cancel()
