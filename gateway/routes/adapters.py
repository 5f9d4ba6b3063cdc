"""vLLM's runtime adapter routes, `POST /v1/load_lora_adapter` and `/v1/unload_lora_adapter`, for a
whole pool of workers: mounted only where `allow_runtime_lora_updating` is set (vLLM's
`VLLM_ALLOW_RUNTIME_LORA_UPDATING`), for admin keys, with vLLM's bodies, answers and errors.

A load is kept in Redis (`shared.adapters`) for every worker of its model, those that start later
included, and answered once one of them holds it; an unload is answered at once, and the workers let
the adapter's running jobs finish.
"""

from __future__ import annotations

import asyncio

from fastapi import APIRouter
from fastapi.responses import PlainTextResponse

from gateway.auth import REQUIRE_ADMIN
from gateway.compat.vllm import (
    LOAD_LORA_ADAPTER_PATH,
    UNLOAD_LORA_ADAPTER_PATH,
    LoadLoRAAdapterBody,
    UnloadLoRAAdapterBody,
)
from gateway.deps import Services, ServicesDep
from gateway.routes.openai import ERRORS, OpenAIRoute
from shared.adapters import RuntimeAdapter, register, runtime_adapters, unregister
from shared.errors import BackendUnavailable, EngineError, InvalidRequest, ModelNotFound
from shared.models import ADAPTER_SEPARATOR
from shared.workers import live_workers

LOAD_POLL_SECONDS = 0.2

router = APIRouter(tags=["vllm"], dependencies=[REQUIRE_ADMIN], responses=ERRORS, route_class=OpenAIRoute)


@router.post(LOAD_LORA_ADAPTER_PATH, response_class=PlainTextResponse)
async def load_lora_adapter(body: LoadLoRAAdapterBody, services: ServicesDep) -> str:
    """Load a LoRA adapter on every worker of the model (`model`, where several are served), now and as
    they start; answered once one holds it, or with why none could load it. `load_inplace` replaces the
    weights of an adapter loaded before under this name."""
    adapter = await _checked(body, services)
    if not await register(services.redis, services.keys, adapter):
        raise _already_loaded(adapter.name)
    services.admission.forget_catalog()
    await _held(services, adapter)
    return f"Success: LoRA adapter '{adapter.name}' added successfully."


@router.post(UNLOAD_LORA_ADAPTER_PATH, response_class=PlainTextResponse)
async def unload_lora_adapter(body: UnloadLoRAAdapterBody, services: ServicesDep) -> str:
    """Unload an adapter loaded at run time: its jobs are refused from now on (404), and each worker
    takes it out of its engine once the adapter's running jobs have finished."""
    name = body.lora_name
    if not name:
        raise InvalidRequest("'lora_name' needs to be provided to unload a LoRA adapter.", param="lora_name")
    if not await unregister(services.redis, services.keys, name):
        target = (await services.admission.catalog()).names.get(name)
        if target is not None and target.adapter is not None:
            raise InvalidRequest(
                f"The lora adapter '{name}' was given to the workers of {target.model} at start (`lora`): "
                "start them without it",
                param="lora_name",
            )
        raise ModelNotFound(f"The lora adapter '{name}' cannot be found.", param="lora_name")
    services.admission.forget_catalog()
    return f"Success: LoRA adapter '{name}' removed successfully."


async def _checked(body: LoadLoRAAdapterBody, services: Services) -> RuntimeAdapter:
    """The adapter a load asks for, refused as vLLM refuses it (and for a name that cannot be one here)."""
    name = body.lora_name
    if not name or not body.lora_path:
        raise InvalidRequest("Both 'lora_name' and 'lora_path' must be provided.")
    if ADAPTER_SEPARATOR in name:
        raise InvalidRequest(
            f"lora_name: an adapter's name cannot hold '{ADAPTER_SEPARATOR}' (requests name "
            f"`<model>{ADAPTER_SEPARATOR}<adapter>`)",
            param="lora_name",
        )
    catalog = await services.admission.catalog()
    target = catalog.resolve(body.model, services.settings.default_model)
    if target.adapter is not None:
        raise InvalidRequest(f"model: {body.model} is an adapter; name the model it adapts", param="model")
    named = catalog.names.get(name)
    if named is not None and named.adapter is None:
        raise InvalidRequest(f"The lora adapter '{name}' conflicts with a served base model.")
    loaded = (await runtime_adapters(services.redis, services.keys)).get(name)
    if named is not None and loaded is None:
        raise InvalidRequest(
            f"The lora adapter '{name}' was given to the workers of {named.model} at start (`lora`)"
        )
    if loaded is not None and (not body.load_inplace or loaded.model != target.model):
        raise _already_loaded(name)
    return RuntimeAdapter(
        name=name,
        model=target.model,
        path=body.lora_path,
        load_inplace=body.load_inplace,
        is_3d_lora_weight=body.is_3d_lora_weight,
    )


def _already_loaded(name: str) -> InvalidRequest:
    return InvalidRequest(
        f"The lora adapter '{name}' has already been loaded. If you want to load the adapter in place, "
        "set 'load_inplace' to True."
    )


async def _held(services: Services, adapter: RuntimeAdapter) -> None:
    """Wait until a worker of the adapter's model holds this load. Where every live one failed to load
    it, the load is withdrawn and its error raised (404 where its path holds no adapter, as vLLM); past
    `adapter_load_wait_seconds` without a worker's word, 503, and it stays loaded for the workers to come."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + services.settings.adapter_load_wait_seconds
    while True:
        workers = [w for w in await live_workers(services.redis, services.keys) if w.model == adapter.model]
        loads = [load for w in workers if (load := w.runtime_adapters.get(adapter.name)) is not None]
        loads = [load for load in loads if load.load_id == adapter.load_id]
        if any(load.error is None for load in loads):
            return
        if workers and len(loads) == len(workers):  # each live worker tried, and each failed
            await unregister(services.redis, services.keys, adapter.name, adapter.load_id)
            services.admission.forget_catalog()
            error = loads[0]
            if error.not_found:
                raise ModelNotFound(error.error or "", param="lora_path")
            raise EngineError(error.error or "")
        if loop.time() >= deadline:
            raise BackendUnavailable(
                f"no worker of {adapter.model} holds the adapter {adapter.name} after "
                f"{services.settings.adapter_load_wait_seconds:g} s ({len(workers)} live, {len(loads)} "
                f"failed); it stays loaded: each worker of {adapter.model} loads it as it starts, and its "
                "jobs queue until one does"
            )
        await asyncio.sleep(LOAD_POLL_SECONDS)
