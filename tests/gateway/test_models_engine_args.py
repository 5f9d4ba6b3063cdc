"""`/v1/models` shows each model's engine configuration as its live workers' heartbeats carry it, once
per distinct configuration. No engine runs here: the heartbeats are written as a worker writes them."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator

import pytest
import redis.asyncio as aioredis

from shared.config import Settings
from shared.keys import Keys
from shared.workers import WorkerInfo, announce
from tests.conftest import delete_test_keys, make_settings
from tests.helpers import in_process_gateway

ENGINE = {"max_num_batched_tokens": "1024", "enable_prefix_caching": "True"}


async def beat(redis: aioredis.Redis, keys: Keys, worker_id: str, engine_args: dict[str, str]) -> None:
    now = time.time()
    info = WorkerInfo(
        worker_id=worker_id,
        model="smol",
        max_model_len=512,
        engine_args=engine_args,
        running_jobs=0,
        engine_requests=0,
        started_at=now,
        heartbeat_at=now,
        host="test",
        pid=0,
    )
    await announce(redis, keys, info, 60_000)


@pytest.fixture
async def settings(redis_url: str, redis_client: aioredis.Redis) -> AsyncIterator[Settings]:
    settings = make_settings(redis_url, allow_unauthenticated=True, default_model=None)
    yield settings
    await delete_test_keys(redis_client, Keys.of(settings))


async def test_a_models_engine_configuration_is_listed_once_per_distinct_one(
    settings: Settings, redis_client: aioredis.Redis
) -> None:
    keys = Keys.of(settings)
    await beat(redis_client, keys, "w1", ENGINE)
    await beat(redis_client, keys, "w2", dict(reversed(ENGINE.items())))  # the same, in another order
    await beat(redis_client, keys, "w3", {**ENGINE, "seed": "7"})
    async with in_process_gateway(settings) as http:
        smol = (await http.get("/v1/models/smol")).json()
    assert smol["workers"] == 3
    assert sorted(smol["engine_args"], key=len) == [ENGINE, {**ENGINE, "seed": "7"}]
