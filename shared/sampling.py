"""A job's sampling options under the names of vLLM's `SamplingParams`. Pure: no vllm import.

The worker builds vLLM's parameters from them; the gateway answers vLLM's render routes with them
and reads them back from a tokens-in/tokens-out request, so the three cannot drift apart.
"""

from __future__ import annotations

from typing import Any

from shared.requests import JobRequest

SAME_NAMES = frozenset(
    {
        "n",
        "max_tokens",
        "temperature",
        "top_p",
        "seed",
        "logprobs",
        "prompt_logprobs",
        "stop_token_ids",
        "include_stop_str_in_output",
        "ignore_eos",
        "min_tokens",
        "min_p",
        "presence_penalty",
        "frequency_penalty",
        "repetition_penalty",
        "skip_special_tokens",
        "spaces_between_special_tokens",
    }
)
"""The job's fields that `SamplingParams` takes as they are, under the same names."""


def vllm_sampling_fields(request: JobRequest) -> dict[str, Any]:
    """`SamplingParams`' fields for a job's sampling options; `structured_outputs` as a plain mapping
    (vLLM's `StructuredOutputsParams` fields), `logit_bias` keyed by token id."""
    constraint = request.structured_outputs
    return {
        **request.model_dump(include=set(SAME_NAMES)),
        "top_k": request.top_k or 0,
        "stop": request.stop_strings or None,
        "logit_bias": {int(token): bias for token, bias in (request.logit_bias or {}).items()} or None,
        "structured_outputs": None if constraint is None else constraint.model_dump(exclude_none=True),
    }
