"""vLLM's render routes: a completion's or a chat's request in, the tokens-in/tokens-out requests the
engine would run for it out (`GenerateRequest`, which `/inference/v1/generate` takes). Pure, no I/O.

The token ids are the model card's tokenizer's and chat template's, the ones the workers' engine
uses, after `truncate_prompt_tokens`; the sampling parameters are the job's under vLLM's names
(`shared.sampling`), `max_tokens` as the job would run with it.
"""

from __future__ import annotations

from typing import Any

from gateway.compat.openai_bodies import ChatBody, CompletionBody
from shared.requests import JobRequest
from shared.sampling import vllm_sampling_fields

COMPLETIONS_RENDER_PATH = "/v1/completions/render"
CHAT_RENDER_PATH = "/v1/chat/completions/render"


def render_requests(
    job: JobRequest,
    body: CompletionBody | ChatBody,
    token_ids: list[list[int]],
    base_id: str,
    max_model_len: int,
) -> list[dict[str, Any]]:
    """One request per prompt, as vLLM renders them: ids `cmpl-<base>` (`-<i>` for each of several
    prompts) or `chatcmpl-<base>`. A `priority` is written only where the body gave one: the job's
    default is its tenant's, which a rendered 0 would override."""
    prefix = "chatcmpl" if body.chat else "cmpl"
    stream = bool(body.stream)
    rendered = []
    for number, (one, ids) in enumerate(zip(job.each_prompt(), token_ids, strict=True)):
        kept = job.kept_prompt_tokens(len(ids), max_model_len)
        request: dict[str, Any] = {
            "request_id": f"{prefix}-{base_id}" if len(token_ids) == 1 else f"{prefix}-{base_id}-{number}",
            "token_ids": ids[len(ids) - kept :],
            "token_offsets": None,
            "features": None,
            "content_parts": None,
            "sampling_params": vllm_sampling_fields(one),
            "model": body.model,
            "reasoning_ended": None,
            "reasoning_parser_kwargs": None,
            "return_token_ids": None,
            "output_mode": "tokens",
            "stream": stream,
            "stream_options": body.stream_options.model_dump() if stream and body.stream_options else None,
            "cache_salt": job.cache_salt,
            "kv_transfer_params": None,
            "ec_transfer_params": None,
        }
        if job.priority is not None:
            request["priority"] = job.priority
        rendered.append(request)
    return rendered
