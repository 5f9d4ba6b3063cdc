"""vLLM's tokens-in/tokens-out request (`POST /inference/v1/generate`), checked and turned into a job.
Pure, no I/O; the answers are in `generate_answers`.

The shape is vLLM's `GenerateRequest` (`vllm/entrypoints/scale_out/token_in_token_out/protocol.py`):
token ids in, `sampling_params` under the names of vLLM's `SamplingParams`, every one that a job
takes. What the render routes answer comes back here as it is, so every field they write is taken;
one that asks for what a text model served here does not do (multimodal input, KV or encoder-cache
transfer, a reasoning parser, prompt logprobs...) is refused with its name, never ignored. The
engine's own settings (`output_kind`, `skip_clone`, `output_text_buffer_length`) are the server's to
set, as on vLLM's server.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from gateway.compat.openai_bodies import (
    Integer,
    Name,
    Number,
    Objects,
    Refusal,
    StopText,
    in_terms,
    job_request_of,
    refuse,
)
from shared.errors import InvalidRequest
from shared.requests import MAX_PROMPT_CHARS, MAX_STOP_STRINGS, MAX_STOP_TOKEN_IDS, Deadline, JobRequest
from shared.sampling import SAME_NAMES

GENERATE_PATH = "/inference/v1/generate"

NEUTRAL: tuple[object, ...] = (None, False, 0, [], {})
"""The values of an option that ask for nothing: the render routes write some of them (`bad_words: []`)."""
NOT_HERE = {
    "watermarking": "watermarking is not supported",
    "prompt_logprobs": "prompt logprobs are not reported",
    "prompt_logprob_token_ids": "prompt logprobs are not reported",
    "prompt_logprob_start": "prompt logprobs are not reported",
    "logprob_token_ids": "logprobs of chosen token ids are not reported; use logprobs",
    "flat_logprobs": "flat logprobs are not supported",
    "allowed_token_ids": "allowed_token_ids is not supported; use logit_bias",
    "bad_words": "bad_words is not supported",
    "extra_args": "extra_args is not supported",
    "skip_reading_prefix_cache": "the prefix cache is the engine's to use",
    "thinking_token_budget": "no reasoning parser runs here",
    "repetition_detection": "repetition detection is not supported",
    "routed_experts_prompt_start": "expert routing is not reported",
    "trace_decode_token_ids": "decode traces are not reported",
}
"""`SamplingParams`' options a job cannot honour, and why: refused unless `NEUTRAL`."""
MAPPED = frozenset({"top_k", "stop", "logit_bias", "structured_outputs"})
"""Options with vLLM's name in a job too, whose values are converted (`GenerateBody.job_request`)."""
TokenIds = Annotated[list[Annotated[Integer, Field(strict=True, ge=0)]], Field(max_length=MAX_PROMPT_CHARS)]


class GenerateStreamOptions(BaseModel):
    """As vLLM's: usage at the end, and with `continuous_usage_stats` on every chunk too."""

    model_config = ConfigDict(extra="forbid")

    include_usage: bool | None = False
    continuous_usage_stats: bool | None = False


class GenerateSamplingParams(BaseModel):
    """`sampling_params`: vLLM's `SamplingParams`, with vLLM's defaults; `max_tokens` absent or null
    generates as many as the context leaves (within `max_tokens_limit`), as vLLM's route does."""

    model_config = ConfigDict(extra="forbid")

    n: Integer | None = None
    presence_penalty: Number | None = None
    frequency_penalty: Number | None = None
    repetition_penalty: Number | None = None
    temperature: Number | None = None
    top_p: Number | None = None
    top_k: Integer | None = None  # 0 and -1: no limit
    min_p: Number | None = None
    seed: Integer | None = None
    stop: StopText | Annotated[list[StopText], Field(max_length=MAX_STOP_STRINGS)] | None = None
    stop_token_ids: Annotated[list[Integer], Field(max_length=MAX_STOP_TOKEN_IDS)] | None = None
    ignore_eos: bool | None = None
    max_tokens: Integer | None = None
    min_tokens: Integer | None = None
    logprobs: Integer | None = None
    detokenize: bool = True
    skip_special_tokens: bool | None = None
    spaces_between_special_tokens: bool | None = None
    include_stop_str_in_output: bool | None = None
    stream_interval: Integer | None = None  # tokens per streamed chunk: the job's stream_step
    structured_outputs: dict[str, Any] | None = None  # the job checks it
    logit_bias: Annotated[dict[Integer, Number], Field(max_length=1024)] | None = None
    # Set by the server, as on vLLM's: taken, and left to it.
    output_kind: Integer | None = None
    skip_clone: bool | None = None
    output_text_buffer_length: Integer | None = None
    # What a job cannot honour: refused unless neutral (NOT_HERE).
    watermarking: Any = None
    prompt_logprobs: Any = None
    prompt_logprob_token_ids: Any = None
    prompt_logprob_start: Any = None
    logprob_token_ids: Any = None
    flat_logprobs: Any = None
    allowed_token_ids: Any = None
    bad_words: Any = None
    extra_args: Any = None
    skip_reading_prefix_cache: Any = None
    thinking_token_budget: Any = None
    repetition_detection: Any = None
    routed_experts_prompt_start: Any = None
    trace_decode_token_ids: Any = None

    def refusals(self) -> list[Refusal]:
        return [
            (getattr(self, name) not in NEUTRAL, f"sampling_params.{name}", reason)
            for name, reason in NOT_HERE.items()
        ]

    def job_fields(self, max_tokens_limit: int) -> dict[str, Any]:
        """The job's fields for these options (None where the job's default applies)."""
        return {
            **self.model_dump(include=set(SAME_NAMES - {"max_tokens"})),
            "max_tokens": max_tokens_limit if self.max_tokens is None else self.max_tokens,
            "top_k": None if self.top_k in (-1, 0) else self.top_k,
            "stop": self.stop or None,
            "logit_bias": {str(token): bias for token, bias in (self.logit_bias or {}).items()} or None,
            "structured_outputs": self.structured_outputs,
            "stream_step": self.stream_interval,
        }


PARAMETER_NAMES = {
    **{name: f"sampling_params.{name}" for name in SAME_NAMES | MAPPED},
    "stream_step": "sampling_params.stream_interval",
    "prompt_token_ids": "token_ids",
}
"""The request's name of each job field it sets."""


class GenerateBody(BaseModel):
    """`POST /inference/v1/generate`: vLLM's `GenerateRequest`, for a text model."""

    model_config = ConfigDict(extra="forbid")

    request_id: Name | None = None  # the answer's is `generate-tokens-<it>`; default: the job's id
    token_ids: Annotated[TokenIds, Field(min_length=1)]
    token_offsets: Annotated[list[tuple[Integer, Integer]], Field(max_length=MAX_PROMPT_CHARS)] | None = None
    features: dict[str, Any] | None = None
    content_parts: Objects | None = None
    sampling_params: GenerateSamplingParams
    model: Name | None = None
    reasoning_ended: bool | None = None
    reasoning_parser_kwargs: dict[str, Any] | None = None
    return_token_ids: bool | None = None
    output_mode: Literal["tokens", "text"] = "tokens"
    stream: bool | None = False
    stream_options: GenerateStreamOptions | None = None
    cache_salt: Name | None = None
    priority: Integer | None = None
    kv_transfer_params: dict[str, Any] | None = None
    ec_transfer_params: dict[str, Any] | None = None
    deadline: Deadline | None = None  # streampool's: still queued then, the job fails unrun

    @property
    def fills_context(self) -> bool:
        return self.sampling_params.max_tokens is None

    @property
    def include_usage(self) -> bool:
        return self.stream_options is not None and bool(self.stream_options.include_usage)

    @property
    def continuous_usage(self) -> bool:
        """As vLLM: usage on every chunk only when usage is asked for at all."""
        options = self.stream_options
        return self.include_usage and options is not None and bool(options.continuous_usage_stats)

    def _refusals(self) -> list[Refusal]:
        text_model = "a text model is served here"
        params = self.sampling_params
        return [
            (self.features is not None, "features", f"multimodal features are not supported: {text_model}"),
            (bool(self.content_parts), "content_parts", f"multimodal content is not supported: {text_model}"),
            (self.kv_transfer_params is not None, "kv_transfer_params", "KV cache transfer is not supported"),
            (
                self.ec_transfer_params is not None,
                "ec_transfer_params",
                "encoder cache transfer is not supported",
            ),
            (
                self.reasoning_parser_kwargs is not None,
                "reasoning_parser_kwargs",
                "no reasoning parser runs here",
            ),
            (
                self.reasoning_ended is False,
                "reasoning_ended",
                "no reasoning parser runs here: structured output holds from the first token",
            ),
            (
                self.output_mode == "text" and not params.detokenize,
                "output_mode",
                "output_mode='text' requires sampling_params.detokenize to be true",
            ),
            (
                bool(params.stop) and not params.detokenize,
                "sampling_params.stop",
                "stop strings are only supported when detokenize is true",
            ),
            *params.refusals(),
        ]

    def in_own_terms(self, exc: InvalidRequest) -> InvalidRequest:
        """A refusal of a job field (the gateway's limits), under this request's name for it."""
        return in_terms(exc, PARAMETER_NAMES)

    def job_request(self, max_tokens_limit: int) -> JobRequest:
        """The job this request asks for; `InvalidRequest` (naming the parameter) when it cannot be one.
        Without `max_tokens` the job gets what the context leaves (`fills_context`, within the limit)."""
        refuse(self._refusals())
        fields = {
            "prompt_token_ids": self.token_ids,
            **self.sampling_params.job_fields(max_tokens_limit),
            "cache_salt": self.cache_salt,
            "priority": self.priority,
            "deadline": self.deadline,
        }
        return job_request_of(
            {name: value for name, value in fields.items() if value is not None}, PARAMETER_NAMES
        )
