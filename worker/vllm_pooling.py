"""vLLM's own pooling serving code over a worker's `AsyncLLM`: the only module that imports it.

A pooling job's body goes to the handler vLLM's server has for its route (`/v1/embeddings`, `/pooling`,
`/classify`, `/score`, `/rerank`), built by vLLM's `init_pooling_state` and called as its api_router
calls it; the JSON of the handler's response is the job's answer. What the pool serves is decided as
vLLM's `register_pooling_api_routers` decides which routes its server has.
"""

from __future__ import annotations

import json
from typing import Any

from fastapi.responses import Response, StreamingResponse
from pydantic import TypeAdapter, ValidationError
from starlette.datastructures import State
from vllm.config import ModelConfig
from vllm.entrypoints.launchers.cli_args import BaseFrontendArgs
from vllm.entrypoints.openai.models.protocol import BaseModelPath
from vllm.entrypoints.openai.models.serving import OpenAIServingModels
from vllm.entrypoints.pooling.classify.protocol import ClassificationRequest
from vllm.entrypoints.pooling.embed.protocol import EmbeddingRequest
from vllm.entrypoints.pooling.factories import init_pooling_state
from vllm.entrypoints.pooling.pooling.protocol import PoolingRequest
from vllm.entrypoints.pooling.scoring.protocol import RerankRequest, ScoreRequest
from vllm.entrypoints.pooling.utils import enable_scoring_api
from vllm.entrypoints.serve.engine.protocol import ErrorResponse
from vllm.entrypoints.serve.exception_handling.error_response import create_error_response
from vllm.entrypoints.serve.exception_handling.handlers.validation import clean_loc_for_param
from vllm.tasks import SupportedTask
from vllm.v1.engine.async_llm import AsyncLLM
from vllm.v1.engine.exceptions import EngineDeadError

from shared.config import WorkerSettings
from shared.errors import EngineDead, EngineError
from shared.pooling import POOLING_ERROR_STATUS, PoolingJob, PoolingRoute
from worker.engine import Serving

REQUESTS: dict[PoolingRoute, TypeAdapter[Any]] = {
    "embeddings": TypeAdapter(EmbeddingRequest),
    "pooling": TypeAdapter(PoolingRequest),
    "classify": TypeAdapter(ClassificationRequest),
    "score": TypeAdapter(ScoreRequest),
    "rerank": TypeAdapter(RerankRequest),
}
"""Each route's request model, as vLLM's server validates its body."""

STATES: dict[PoolingRoute, tuple[str, str]] = {
    "embeddings": ("serving_embedding", "Embeddings API"),
    "pooling": ("serving_pooling", "Pooling API"),
    "classify": ("serving_classification", "Classification API"),
    "score": ("serving_scores", "Score API"),
    "rerank": ("serving_scores", "Rerank (Score) API"),
}
"""Each route's handler in the server's state, and what vLLM calls it when the model has none."""


def pooling_routes(tasks: tuple[SupportedTask, ...], model_config: ModelConfig) -> list[PoolingRoute]:
    """The pooling routes vLLM's server has for a model of these tasks (`register_pooling_api_routers`)."""
    routes: list[PoolingRoute] = []
    if model_config.get_pooling_task(tasks) is not None:
        routes.append("pooling")
    if "classify" in tasks:
        routes.append("classify")
    if "embed" in tasks:
        routes.append("embeddings")
    if enable_scoring_api(tasks, model_config):
        routes += ["score", "rerank"]
    return routes


class VllmPooling:
    """vLLM's pooling handlers for one engine, as its server builds them at start-up."""

    def __init__(self, llm: AsyncLLM, settings: WorkerSettings, tasks: tuple[SupportedTask, ...]) -> None:
        self._llm = llm
        # Where vLLM schedules by priority, a request's own counts; else the queue has ordered the job by it.
        self._by_priority = llm.vllm_config.scheduler_config.policy == "priority"
        self.serving = Serving("generate" in tasks, pooling_routes(tasks, llm.model_config))
        self._state = State()
        if not self.serving.pooling_routes:
            return
        self._state.openai_serving_models = OpenAIServingModels(
            engine_client=llm,
            base_model_paths=[
                BaseModelPath(name=name, model_path=str(settings.model)) for name in settings.model_names
            ],
        )
        # The frontend's own defaults (`vllm serve` with no frontend flag), but for the worker's settings.
        frontend = BaseFrontendArgs()
        frontend.chat_template = settings.chat_template
        frontend.trust_request_chat_template = settings.trust_request_chat_template
        init_pooling_state(llm, self._state, frontend, None, tasks)  # type: ignore[arg-type]

    @classmethod
    async def start(cls, llm: AsyncLLM, settings: WorkerSettings) -> VllmPooling:
        return cls(llm, settings, await llm.get_supported_tasks())

    async def answer(self, request_id: str, job: PoolingJob) -> dict[str, Any]:
        """The JSON of vLLM's answer to the job's body on its route; its refusal as `EngineError`."""
        try:
            request = REQUESTS[job.route].validate_python(job.body)
        except ValidationError as exc:  # as vLLM's server refuses a body its model does not take
            raise EngineError(_validation_message(exc), code="BadRequestError") from exc
        if hasattr(request, "request_id"):
            request.request_id = request_id  # the answer's id, and its engine requests' ids, are the job's
        if not self._by_priority and hasattr(request, "priority"):
            request.priority = 0  # as a generation's: first come, first served refuses any other
        name, api = STATES[job.route]
        handler = getattr(self._state, name, None)
        try:
            if handler is None or job.route not in self.serving.pooling_routes:
                raise NotImplementedError(f"The model does not support {api}")
            response = await handler(request, None)
        except EngineDeadError as exc:
            raise EngineDead(f"the engine died: {exc!r}") from exc
        except Exception as exc:  # what vLLM's exception handlers answer, as they answer it
            if self._llm.errored:
                raise EngineDead(f"the engine died: {exc!r}") from exc
            raise _refusal(create_error_response(exc)) from exc
        if isinstance(response, ErrorResponse):
            raise _refusal(response)
        if isinstance(response, StreamingResponse) or not isinstance(response, Response):
            raise EngineError(
                "a binary answer (encoding_format bytes or bytes_only) is not served through the queue: "
                "ask for float or base64",
                code="BadRequestError",
            )
        result: dict[str, Any] = json.loads(bytes(response.body))
        return result


def _refusal(response: ErrorResponse) -> EngineError:
    """vLLM's error answer as a job's failure: its message, and its type as the code (a type vLLM's
    server answers with a status outside `POOLING_ERROR_STATUS` as the one of its class)."""
    error = response.error
    code = error.type
    if code not in POOLING_ERROR_STATUS:
        code = "BadRequestError" if error.code < 500 else "InternalServerError"
    return EngineError(error.message, code=code)


def _validation_message(exc: ValidationError) -> str:
    """A body's validation errors, each as where and what, named as vLLM's server names them."""
    errors = exc.errors(include_url=False, include_input=False)
    label = "error" if len(errors) == 1 else "errors"
    found = "; ".join(f"{clean_loc_for_param(tuple(error['loc']))}: {error['msg']}" for error in errors[:10])
    return f"{len(errors)} validation {label}: {found}"
