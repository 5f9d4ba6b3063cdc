"""vLLM's own routes beside the OpenAI API, for clients of a text model (vLLM's benchmark client
among them): `/tokenize`, `/detokenize`, `/version`, and one model at `/v1/models/{id}`.

Tokenizing needs no worker: the gateway answers with the model card the workers published, the
tokenizer and chat template their engine uses. Errors take OpenAI's shape, as on vLLM's server.
"""

from __future__ import annotations

import asyncio
from importlib.metadata import version as package_version
from typing import Any

from fastapi import APIRouter
from starlette.convertors import Convertor, register_url_convertor

from gateway.auth import REQUIRE_KEY
from gateway.compat.vllm import (
    DETOKENIZE_PATH,
    TOKENIZE_PATH,
    DetokenizeBody,
    DetokenizeResponse,
    TokenizeChatBody,
    TokenizeCompletionBody,
    TokenizeResponse,
    detokenize,
    tokenize,
)
from gateway.deps import Services, ServicesDep
from gateway.routes.health import model_listing
from gateway.routes.openai import ERRORS, OpenAIRoute
from shared.errors import BackendUnavailable, ModelNotFound
from shared.prompt_tokens import PromptCounter

router = APIRouter(tags=["vllm"], responses=ERRORS, route_class=OpenAIRoute)


class ModelIdConvertor(Convertor[str]):
    """A model id in a path as vLLM takes it: any text, `org/name` slashes and line breaks
    included (Starlette's `path` stops at a line break), so that every id reaches the route and
    an unknown one gets the route's own 404 in OpenAI's shape."""

    regex = "(?s:.+)"

    def convert(self, value: str) -> str:
        return value

    def to_string(self, value: str) -> str:
        return value


register_url_convertor("model_id", ModelIdConvertor())


async def model_counter(services: Services, model: str | None) -> PromptCounter:
    """The tokenizer of the model a body names (as vLLM, a body may leave it out: then the default
    model's); 404 for an unknown model, 503 until a worker of it has published its model card."""
    target = await services.admission.resolve(model)
    counter = await services.admission.prompt_limit.counter(target.model)
    if counter is None:
        raise BackendUnavailable(
            f"no model card: no worker of {target.model} has published its tokenizer yet"
        )
    return counter


@router.post(TOKENIZE_PATH, dependencies=[REQUIRE_KEY])
async def tokenize_prompt(
    body: TokenizeCompletionBody | TokenizeChatBody, services: ServicesDep
) -> TokenizeResponse:
    """A prompt's (or a chat's) token ids as the engine will see them, and the model's context."""
    counter = await model_counter(services, body.model)
    # Megabytes of prompt take a while to encode: off the event loop.
    return await asyncio.to_thread(tokenize, counter, body)


@router.post(DETOKENIZE_PATH, dependencies=[REQUIRE_KEY])
async def detokenize_tokens(body: DetokenizeBody, services: ServicesDep) -> DetokenizeResponse:
    """The text of token ids, special tokens kept."""
    counter = await model_counter(services, body.model)
    return await asyncio.to_thread(detokenize, counter, body)


@router.get("/v1/models/{model:model_id}", dependencies=[REQUIRE_KEY])
async def model(model: str, services: ServicesDep) -> dict[str, Any]:
    """One model (or adapter) by a name it goes by, as in `/v1/models`; 404 for any other."""
    listing = await model_listing(services)
    if model in listing:
        return listing[model]
    if not listing:
        raise ModelNotFound(f"The model `{model}` does not exist", param="model")
    target = (await services.admission.catalog()).resolve(model)  # `model:adapter`, or 404
    return listing[target.adapter or target.model]


@router.get("/version")
async def version() -> dict[str, str]:
    """streampool's version, where vLLM's server answers vLLM's: the gateway runs no engine."""
    return {"version": package_version("streampool")}
