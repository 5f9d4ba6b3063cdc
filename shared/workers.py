"""Worker heartbeats: what a live worker says about itself, and how the gateway reads them.

A heartbeat is a key with a TTL per worker (its `WorkerInfo`), and the worker's id in one
sorted set scored by when that heartbeat expires. Readers go through the sorted set, so that
finding the live workers costs a few commands whatever else the database holds: the keyspace
is never scanned (a SCAN walks every key, a round trip per thousand). The key's TTL, kept by
Redis's own clock, says whether a worker lives; the set's scores, by the workers' clocks, only
let writers drop the members of workers that vanished without saying so.

Each heartbeat also writes its model's entry to the model registry (`shared.models`), in the same
round trip: a model stays known, its names and adapters with it, after its last worker is gone.
"""

from __future__ import annotations

import redis.asyncio as aioredis
from pydantic import BaseModel

from shared.adapters import AdapterLoad
from shared.keys import Keys
from shared.models import ModelEntry
from shared.redis_client import redis_errors


class WorkerInfo(BaseModel):
    worker_id: str
    model: str  # the canonical name, which names the model's queue
    aliases: list[str] = []  # its other served names
    adapters: list[str] = []  # the LoRA adapters of it given to this worker at start (`lora`)
    adapter_paths: dict[str, str] = {}  # where each of those comes from
    runtime_adapters: dict[str, AdapterLoad] = {}  # the adapters loaded at run time it holds, or failed to
    max_model_len: int
    # The longest token's characters: with the context, the longest text a prompt can be, by which a
    # gateway without the model's card bounds a prompt (as vLLM does before it tokenizes); None from a
    # worker that predates it.
    max_chars_per_token: int | None = None
    dtype: str | None = None  # the dtype the engine runs in; None from a worker that predates it
    # The engine's arguments that are not `vllm serve`'s defaults, as short text (bounded): what it runs with.
    engine_args: dict[str, str] = {}
    running_jobs: int
    max_jobs: int | None = None  # the most it runs at once (`worker_max_jobs`); None from an older worker
    engine_requests: int
    # Counted since the worker started, so that a reader diffs two heartbeats for a rate: the tokens its
    # engine generated and the publisher's round trips (one per engine step, however many jobs).
    generated_tokens: int = 0
    steps: int = 0
    kv_cache_usage: float | None = None  # vLLM's `vllm:kv_cache_usage_perc` (0 to 1), once the engine has one
    draining: bool = False  # stopping: it takes no new jobs
    started_at: float
    heartbeat_at: float
    host: str
    pid: int

    def model_entry(self) -> ModelEntry:
        """What the model registry keeps of this worker's model: the adapters loaded at run time are
        the registry's own (`shared.adapters`), not a worker's to keep known."""
        return ModelEntry(
            name=self.model,
            aliases=self.aliases,
            adapters=self.adapters,
            adapter_paths=self.adapter_paths,
            max_model_len=self.max_model_len,
            max_chars_per_token=self.max_chars_per_token,
            last_seen=self.heartbeat_at,
        )


async def announce(redis: aioredis.Redis, keys: Keys, info: WorkerInfo, ttl_ms: int) -> None:
    """Say that a worker lives for `ttl_ms` more, in one round trip.

    Members whose heartbeat expired a whole TTL ago, by this worker's clock, leave the set: a
    worker that crashed cannot say goodbye, and clocks a little apart must not drop a live one.
    The set itself lives as long as its longest heartbeat (NX, then GT: set or extend, never
    shorten), so that nothing is left once every worker is gone.
    """
    expires_at = int(info.heartbeat_at * 1000) + ttl_ms
    with redis_errors():
        async with redis.pipeline(transaction=True) as pipe:
            pipe.set(keys.worker(info.worker_id), info.model_dump_json(), px=ttl_ms)
            pipe.zadd(keys.workers, {info.worker_id: expires_at})
            pipe.zremrangebyscore(keys.workers, "-inf", expires_at - 2 * ttl_ms)
            pipe.pexpire(keys.workers, ttl_ms, nx=True)
            pipe.pexpire(keys.workers, ttl_ms, gt=True)
            pipe.hset(keys.models, info.model, info.model_entry().model_dump_json())
            await pipe.execute()


async def withdraw(redis: aioredis.Redis, keys: Keys, worker_id: str) -> None:
    """Remove a worker's heartbeat at once, so that gateways stop counting it."""
    with redis_errors():
        async with redis.pipeline(transaction=True) as pipe:
            pipe.delete(keys.worker(worker_id))
            pipe.zrem(keys.workers, worker_id)
            await pipe.execute()


async def live_workers(redis: aioredis.Redis, keys: Keys) -> list[WorkerInfo]:
    """Workers whose heartbeat has not expired, by id: two round trips whatever the database holds,
    and a third to drop the members whose heartbeat has (each once)."""
    with redis_errors():
        worker_ids: list[str] = await redis.zrange(keys.workers, 0, -1)
        values = await redis.mget([keys.worker(worker_id) for worker_id in worker_ids]) if worker_ids else []
        gone = [worker_id for worker_id, value in zip(worker_ids, values, strict=True) if value is None]
        if gone:
            await redis.zrem(keys.workers, *gone)
    return sorted(
        (WorkerInfo.model_validate_json(value) for value in values if value is not None),
        key=lambda info: info.worker_id,
    )
