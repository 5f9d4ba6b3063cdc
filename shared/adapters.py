"""LoRA adapters loaded at run time (vLLM's `/v1/load_lora_adapter`), kept in Redis for every worker.

An adapter loaded through the gateway is one field of one hash (`Keys.runtime_adapters`): its name,
the model it adapts, its path, and the id of this load. Every worker of that model loads what the hash
holds (at start, each heartbeat, and at once for a job naming one it does not hold yet) and says in its
heartbeat which load it holds, or why it could not (`AdapterLoad`); the gateway answers a load once a
worker holds it. Unloading removes the field: workers stop taking the adapter's jobs and let those
running finish. Adapters given to a worker at start (`lora`) are not here: they live and die with it.
"""

from __future__ import annotations

import uuid

import redis.asyncio as aioredis
from pydantic import BaseModel, Field

from shared.keys import Keys
from shared.redis_client import redis_errors


class RuntimeAdapter(BaseModel):
    """One adapter loaded at run time: what every worker of `model` loads."""

    name: str
    model: str  # the canonical name of the model it adapts
    path: str  # as the workers see it: a local folder (a shared volume) or a Hugging Face repository
    load_id: str = Field(default_factory=lambda: uuid.uuid4().hex)  # a new one for each load, in place or not
    load_inplace: bool = False  # replaces the weights of the adapter of this name where a worker holds it
    is_3d_lora_weight: bool = False  # vLLM's: the weights of a mixture of experts' adapter are 3D


class AdapterLoad(BaseModel):
    """A worker's word on one runtime adapter, in its heartbeat: the load it holds, or the error that
    its last try at that load raised."""

    load_id: str
    error: str | None = None
    not_found: bool = False  # the error says the path holds no adapter (vLLM answers that one 404)


async def runtime_adapters(redis: aioredis.Redis, keys: Keys) -> dict[str, RuntimeAdapter]:
    """Every adapter loaded at run time on this prefix, by name."""
    with redis_errors():
        values: dict[str, str] = await redis.hgetall(keys.runtime_adapters)  # type: ignore[misc]
    return {name: RuntimeAdapter.model_validate_json(value) for name, value in values.items()}


async def register(redis: aioredis.Redis, keys: Keys, adapter: RuntimeAdapter) -> bool:
    """Keep `adapter` for the workers of its model; a load in place replaces one of its name, any other
    is kept only where none has it (whether it was kept)."""
    value = adapter.model_dump_json()
    with redis_errors():
        if adapter.load_inplace:
            await redis.hset(keys.runtime_adapters, adapter.name, value)  # type: ignore[misc]
            return True
        return bool(await redis.hsetnx(keys.runtime_adapters, adapter.name, value))  # type: ignore[misc]


async def unregister(redis: aioredis.Redis, keys: Keys, name: str, load_id: str | None = None) -> bool:
    """Remove the adapter `name` (only its load `load_id`, when given: a newer load stays); whether it was
    there."""
    with redis_errors():
        if load_id is None:
            return bool(await redis.hdel(keys.runtime_adapters, name))  # type: ignore[misc]
        removed = await redis.eval(_UNREGISTER_LOAD, 1, keys.runtime_adapters, name, load_id)  # type: ignore[misc]
    return bool(removed)


_UNREGISTER_LOAD = """
local value = redis.call('HGET', KEYS[1], ARGV[1])
if value and cjson.decode(value)['load_id'] == ARGV[2] then
  return redis.call('HDEL', KEYS[1], ARGV[1])
end
return 0
"""
