"""Models through the routes: which queue a job joins, the 400 and 404 of a model a request fails
to name well, and `/v1/models` listing every known model under each of its names.

No engine runs here: workers are made "live" by writing their heartbeats to the real Redis, as a
worker would (no job is ever run by them).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest
import redis.asyncio as aioredis

from shared.config import Settings
from shared.keys import Keys
from tests.conftest import delete_test_keys, make_settings
from tests.gateway.stand_ins import heartbeat
from tests.helpers import eventually, in_process_gateway

JOB = {"prompt": "hi", "max_tokens": 8}


@pytest.fixture
async def settings(redis_url: str, redis_client: aioredis.Redis) -> AsyncIterator[Settings]:
    """Two models: `smol` with an alias and an adapter (live), `big` declared (no worker yet)."""
    settings = make_settings(redis_url, allow_unauthenticated=True, default_model=None, models=["big"])
    keys = Keys.of(settings)
    await heartbeat(redis_client, keys, "w1", "smol", aliases=["smol-chat"], adapters=["pirate"])
    yield settings
    await delete_test_keys(redis_client, keys)


async def _queued(redis: aioredis.Redis, settings: Settings, model: str) -> list[str]:
    queued: list[str] = await redis.zrange(Keys.of(settings).model(model).queue, 0, -1)
    return queued


async def test_each_job_joins_the_queue_of_the_model_it_names(
    settings: Settings, redis_client: aioredis.Redis
) -> None:
    async with in_process_gateway(settings) as http:
        by_alias = (await http.post("/v1/jobs", json={**JOB, "model": "smol-chat"})).json()["id"]
        adapter = (await http.post("/v1/jobs", json={**JOB, "model": "pirate"})).json()["id"]
        by_base = (await http.post("/v1/jobs", json={**JOB, "model": "smol-chat:pirate"})).json()["id"]
        big = (await http.post("/v1/jobs", json={**JOB, "model": "big"})).json()["id"]
        records = [
            (await http.get(f"/v1/jobs/{job_id}")).json() for job_id in (by_alias, adapter, by_base, big)
        ]
    assert set(await _queued(redis_client, settings, "smol")) == {
        by_alias,
        adapter,
        by_base,
    }
    assert await _queued(redis_client, settings, "big") == [big]
    assert [(record["model"], record["adapter"]) for record in records] == [
        ("smol", None),
        ("smol", "pirate"),
        ("smol", "pirate"),
        ("big", None),
    ]
    assert [record["waiting"] for record in records] == [
        None,
        None,
        None,
        "waiting for a worker of model big: none is live",
    ]


async def test_a_job_naming_no_model_where_several_are_known_is_400_and_an_unknown_one_404(
    settings: Settings, redis_client: aioredis.Redis
) -> None:
    async with in_process_gateway(settings) as http:
        unnamed = await http.post("/v1/jobs", json=JOB)
        unknown = await http.post("/v1/jobs", json={**JOB, "model": "gpt-4o"})
        tgi = await http.post("/generate", json={"inputs": "hi"})
    assert unnamed.status_code == tgi.status_code == 400
    assert unnamed.json()["error_type"] == "model_required" and unnamed.json()["param"] == "model"
    assert unknown.status_code == 404 and unknown.json()["error_type"] == "model_not_found"
    for model in ("smol", "big"):
        assert await _queued(redis_client, settings, model) == []  # nothing half-created


async def test_models_lists_every_name_with_its_workers_context_and_queue_depth(settings: Settings) -> None:
    async with in_process_gateway(settings) as http:
        await http.post("/v1/jobs", json={**JOB, "model": "big"})

        async def listed() -> dict[str, dict[str, Any]]:
            return {model["id"]: model for model in (await http.get("/v1/models")).json()["data"]}

        models = await eventually(
            listed, "the queued job counted", 5, until=lambda m: m["big"]["queue_depth"] == 1
        )
        one = (await http.get("/v1/models/smol:pirate")).json()
        missing = await http.get("/v1/models/smol:nope")
    assert sorted(models) == ["big", "pirate", "smol", "smol-chat"]
    summary = {
        name: (model["root"], model["parent"], model["workers"], model["max_model_len"])
        for name, model in models.items()
    }
    assert summary == {
        "smol": ("smol", None, 1, 512),
        "smol-chat": ("smol", None, 1, 512),
        "pirate": ("pirate", "smol", 1, 512),
        "big": ("big", None, 0, None),
    }
    assert one == models["pirate"]
    assert missing.status_code == 404 and missing.json()["error"]["code"] == "model_not_found"
