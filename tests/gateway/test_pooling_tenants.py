"""Pooling jobs within their tenants' limits and fair share, as any job: an in-process gateway with a
tenants file, no worker (a queued job holds its tenant's place; the queue is claimed as a worker claims
it)."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest
import redis.asyncio as aioredis

from shared.config import DEFAULT_MODEL_DIR, Settings
from shared.jobstore import JobStore
from shared.keys import Keys
from tests.conftest import make_settings
from tests.gateway.keyed_gateway import bearer
from tests.redis_cleanup import delete_prefix
from tests.shared.transitions import claimed

MODEL = DEFAULT_MODEL_DIR.name
KEYS = {name: f"sk-{name}-{uuid.uuid4().hex}" for name in ("small", "heavy", "light")}
TENANTS = """
[[tenants]]
name = "small"
max_queued_jobs = 1

[[tenants]]
name = "heavy"

[[tenants]]
name = "light"
""" + "".join(f'\n[[keys]]\nkey = "{key}"\ntenant = "{name}"\n' for name, key in KEYS.items())
EMBEDDINGS = {"route": "embeddings", "body": {"input": ["a corpus", "of texts"]}}


@pytest.fixture
async def settings(redis_url: str, tmp_path: Path) -> AsyncIterator[Settings]:
    (tmp_path / "tenants.toml").write_text(TENANTS)
    settings = make_settings(redis_url, api_keys_file=tmp_path / "tenants.toml")
    yield settings
    delete_prefix(redis_url, settings.key_prefix)


async def submitted(gateway: httpx.AsyncClient, tenant: str) -> httpx.Response:
    return await gateway.post("/v1/jobs", json={"pooling": EMBEDDINGS}, headers=bearer(KEYS[tenant]))


async def test_a_tenants_queued_pooling_job_holds_its_place_and_the_next_is_429_with_no_job(
    gateway: httpx.AsyncClient, settings: Settings, redis_client: aioredis.Redis
) -> None:
    first = await submitted(gateway, "small")
    assert first.status_code == 202, first.text
    native = await submitted(gateway, "small")
    assert native.status_code == 429, native.text
    assert native.json()["limit"] == "max_queued_jobs"
    embeddings = await gateway.post(
        "/v1/embeddings", json={"model": MODEL, "input": "a text"}, headers=bearer(KEYS["small"])
    )
    assert embeddings.status_code == 429, embeddings.text
    assert embeddings.json()["error"]["code"] == "rate_limit_exceeded"
    jobs = [key async for key in redis_client.scan_iter(Keys.of(settings).job("*"), _type="hash")]
    assert len(jobs) == 1


async def test_pooling_jobs_are_claimed_by_fair_share_among_tenants(
    gateway: httpx.AsyncClient, settings: Settings, redis_client: aioredis.Redis
) -> None:
    """A tenant that queued three jobs first and one that queued one after: a worker that takes two
    takes one of each."""
    heavy = [(await submitted(gateway, "heavy")).json()["id"] for _ in range(3)]
    light = (await submitted(gateway, "light")).json()["id"]
    store = JobStore(redis_client, Keys.of(settings), settings)
    assert await claimed(store, wanted=2, model=MODEL) == [heavy[0], light]
