"""Bad input gets the documented error, and creates nothing in Redis.

These run the real gateway app in-process against the real Redis, with no worker:
what they check is decided before a job would ever reach one.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
import redis.asyncio as aioredis

from gateway.app import create_app
from shared.config import Settings
from tests.conftest import delete_prefix, free_port, make_settings


@pytest.fixture
async def settings(redis_url: str) -> AsyncIterator[Settings]:
    settings = make_settings(redis_url, max_queued_jobs=3)
    yield settings
    delete_prefix(redis_url, settings.key_prefix)


@pytest.fixture
async def gateway(settings: Settings) -> AsyncIterator[httpx.AsyncClient]:
    app = create_app(settings)
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://gateway") as http:
            yield http


async def _keys(redis_client: aioredis.Redis, settings: Settings) -> set[str]:
    return {key async for key in redis_client.scan_iter(match=f"{settings.key_prefix}:*")}


async def _arq_jobs(redis_client: aioredis.Redis) -> set[str]:
    return {key async for key in redis_client.scan_iter(match="arq:job:*")}


INVALID_BODIES: list[tuple[str, Any]] = [
    ("empty prompt", {"prompt": ""}),
    ("neither prompt nor messages", {"max_tokens": 5}),
    ("both prompt and messages", {"prompt": "hi", "messages": [{"role": "user", "content": "hi"}]}),
    ("max_tokens zero", {"prompt": "hi", "max_tokens": 0}),
    ("max_tokens above the limit", {"prompt": "hi", "max_tokens": 100_000}),
    ("max_tokens as a string", {"prompt": "hi", "max_tokens": "5"}),
    ("temperature out of range", {"prompt": "hi", "temperature": 3.5}),
    ("top_p zero", {"prompt": "hi", "top_p": 0}),
    ("prompt as a number", {"prompt": 42}),
    ("unknown field", {"prompt": "hi", "n": 2}),
    ("unknown chat role", {"messages": [{"role": "robot", "content": "hi"}]}),
    ("empty messages", {"messages": []}),
    ("stream_step zero", {"prompt": "hi", "stream_step": 0}),
    ("logprobs too many", {"prompt": "hi", "logprobs": 50}),
    ("body is a list", ["prompt", "hi"]),
]


@pytest.mark.parametrize(("case", "body"), INVALID_BODIES, ids=[case for case, _ in INVALID_BODIES])
async def test_invalid_submission_is_422_and_creates_nothing(
    gateway: httpx.AsyncClient, redis_client: aioredis.Redis, settings: Settings, case: str, body: Any
) -> None:
    arq_before = await _arq_jobs(redis_client)
    answer = await gateway.post("/v1/jobs", json=body)
    assert answer.status_code == 422, answer.text
    error = answer.json()
    assert error["error_type"] == "validation"
    assert error["error"]
    assert isinstance(error["detail"], list) and error["detail"]
    assert await _keys(redis_client, settings) == set()
    assert await _arq_jobs(redis_client) == arq_before


@pytest.mark.parametrize("raw", [b"{not json", b"", b'{"prompt": "hi",}', b"\xff\xfe"])
async def test_malformed_json_is_422_and_creates_nothing(
    gateway: httpx.AsyncClient, redis_client: aioredis.Redis, settings: Settings, raw: bytes
) -> None:
    answer = await gateway.post("/v1/jobs", content=raw, headers={"Content-Type": "application/json"})
    assert answer.status_code == 422, answer.text
    assert answer.json()["error_type"] == "validation"
    assert await _keys(redis_client, settings) == set()


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("GET", "/v1/jobs/{id}"),
        ("GET", "/v1/jobs/{id}/events"),
        ("POST", "/v1/jobs/{id}/cancel"),
    ],
)
async def test_unknown_job_is_404_and_creates_nothing(
    gateway: httpx.AsyncClient, redis_client: aioredis.Redis, settings: Settings, method: str, path: str
) -> None:
    answer = await gateway.request(method, path.format(id=uuid.uuid4().hex))
    assert answer.status_code == 404, answer.text
    assert answer.json()["error_type"] == "not_found"
    assert await _keys(redis_client, settings) == set()


async def test_unknown_job_sse_is_404_before_the_stream_starts(gateway: httpx.AsyncClient) -> None:
    answer = await gateway.get(f"/v1/jobs/{uuid.uuid4().hex}/events", headers={"Accept": "text/event-stream"})
    assert answer.status_code == 404
    assert answer.json()["error_type"] == "not_found"


async def test_garbage_cursor_is_422(gateway: httpx.AsyncClient) -> None:
    job = (await gateway.post("/v1/jobs", json={"prompt": "hi"})).json()
    answer = await gateway.get(f"/v1/jobs/{job['id']}/events", params={"after": "yesterday"})
    assert answer.status_code == 422
    assert answer.json()["error_type"] == "validation"


async def test_submission_past_the_queue_limit_is_429_with_retry_after(
    gateway: httpx.AsyncClient, redis_client: aioredis.Redis, settings: Settings
) -> None:
    for _ in range(settings.max_queued_jobs):
        assert (await gateway.post("/v1/jobs", json={"prompt": "hi"})).status_code == 202
    keys_before = await _keys(redis_client, settings)
    answer = await gateway.post("/v1/jobs", json={"prompt": "hi"})
    assert answer.status_code == 429
    assert answer.json()["error_type"] == "overloaded"
    assert int(answer.headers["Retry-After"]) >= 1
    assert await _keys(redis_client, settings) == keys_before


async def test_submission_answers_202_with_location_and_urls(gateway: httpx.AsyncClient) -> None:
    answer = await gateway.post("/v1/jobs", json={"prompt": "hi", "max_tokens": 4})
    assert answer.status_code == 202
    job = answer.json()
    assert job["status"] == "queued"
    assert answer.headers["Location"] == f"/v1/jobs/{job['id']}" == job["urls"]["self"]
    assert job["urls"]["events"] == f"/v1/jobs/{job['id']}/events"
    assert job["urls"]["cancel"] == f"/v1/jobs/{job['id']}/cancel"


async def test_same_idempotency_key_returns_the_same_job(gateway: httpx.AsyncClient) -> None:
    headers = {"Idempotency-Key": f"key-{uuid.uuid4()}"}
    first = await gateway.post("/v1/jobs", json={"prompt": "hi"}, headers=headers)
    second = await gateway.post("/v1/jobs", json={"prompt": "hi"}, headers=headers)
    other = await gateway.post("/v1/jobs", json={"prompt": "hi"}, headers={"Idempotency-Key": "another"})
    assert first.json()["id"] == second.json()["id"] != other.json()["id"]
    assert second.headers["Idempotent-Replayed"] == "true"
    assert first.json()["created_at"] == second.json()["created_at"]


async def test_cancel_of_a_queued_job_ends_it_without_a_worker(
    gateway: httpx.AsyncClient, redis_client: aioredis.Redis, settings: Settings
) -> None:
    job_id = (await gateway.post("/v1/jobs", json={"prompt": "hi"})).json()["id"]
    answer = await gateway.post(f"/v1/jobs/{job_id}/cancel")
    assert answer.status_code == 202
    assert answer.json()["status"] == "cancelled"
    record = (await gateway.get(f"/v1/jobs/{job_id}")).json()
    assert record["status"] == "cancelled"
    assert record["started_at"] is None and record["worker"] is None
    page = (await gateway.get(f"/v1/jobs/{job_id}/events")).json()
    assert [event["type"] for event in page["events"]] == ["status", "cancelled"]
    assert page["done"] is True
    # No worker can pick it up any more: it left arq's queue and its arq job is gone.
    assert await redis_client.zscore(f"{settings.key_prefix}:queue", job_id) is None
    assert not await redis_client.exists(f"arq:job:{job_id}")
    again = await gateway.post(f"/v1/jobs/{job_id}/cancel")
    assert again.status_code == 200
    assert again.json()["status"] == "cancelled"


async def test_health_without_workers_is_503_with_the_reason(gateway: httpx.AsyncClient) -> None:
    answer = await gateway.get("/health")
    assert answer.status_code == 503
    assert answer.json()["error_type"] == "unavailable"
    assert "worker" in answer.json()["error"]


async def test_gateway_answers_503_when_redis_is_unreachable() -> None:
    nothing_listens = free_port()
    app = create_app(Settings(redis_url=f"redis://127.0.0.1:{nothing_listens}/0", key_prefix="sptest-down"))
    async with app.router.lifespan_context(app):
        async with httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app), base_url="http://gateway"
        ) as http:
            submit = await http.post("/v1/jobs", json={"prompt": "hi"})
            health = await http.get("/health")
    assert submit.status_code == 503 and submit.json()["error_type"] == "unavailable"
    assert health.status_code == 503 and "Redis" in health.json()["error"]
