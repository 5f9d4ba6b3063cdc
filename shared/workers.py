"""Worker heartbeats: what a live worker says about itself, and how the gateway reads them."""

from __future__ import annotations

import redis.asyncio as aioredis
from pydantic import BaseModel

from shared.keys import Keys
from shared.redis_client import redis_errors


class WorkerInfo(BaseModel):
    worker_id: str
    model: str
    max_model_len: int
    running_jobs: int
    engine_requests: int
    started_at: float
    heartbeat_at: float
    host: str
    pid: int


async def live_workers(redis: aioredis.Redis, keys: Keys) -> list[WorkerInfo]:
    """Workers whose heartbeat has not expired."""
    with redis_errors():
        names = [name async for name in redis.scan_iter(match=keys.worker_pattern, count=1000)]
        values = await redis.mget(names) if names else []
    return sorted(
        (WorkerInfo.model_validate_json(value) for value in values if value is not None),
        key=lambda info: info.worker_id,
    )
