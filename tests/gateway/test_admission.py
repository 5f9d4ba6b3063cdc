"""Admission: every route's job goes through the same checks, and the routes differ only in what
they ask of the live workers (a model by name, an answer they wait for).

No engine runs here: the gateway is in-process on the real Redis, and a worker is made "live"
by writing a heartbeat for it to Redis, as a worker would (no job is ever run by it).
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
from tests.helpers import eventually, in_process_gateway, scrape

MODEL = "served-model"
TOKENS_LIMIT = 64
NATIVE = {"prompt": "hi", "max_tokens": 8}  # the native default (256) is above the limit, and refused


@pytest.fixture
async def settings(redis_url: str, redis_client: aioredis.Redis) -> AsyncIterator[Settings]:
    settings = make_settings(
        redis_url,
        allow_unauthenticated=True,
        max_queued_jobs=1,
        max_tokens_limit=TOKENS_LIMIT,
        default_model=MODEL,
    )
    yield settings
    await delete_test_keys(redis_client, Keys.of(settings))


async def _heartbeat(
    redis_client: aioredis.Redis, settings: Settings, worker_id: str, dtype: str | None = None
) -> None:
    """The gateway counts this worker as serving MODEL."""
    await heartbeat(redis_client, Keys.of(settings), worker_id, MODEL, dtype=dtype)


def _completion(model: str = MODEL) -> dict[str, Any]:
    return {"model": model, "prompt": "Once"}


# Through the routes


async def test_while_no_model_is_known_every_route_refuses_with_503(redis_url: str) -> None:
    """Nothing could ever run a job: no worker has announced a model and the gateway declares none."""
    settings = make_settings(redis_url, allow_unauthenticated=True, default_model=None)
    async with in_process_gateway(settings) as http:
        native = await http.post("/v1/jobs", json=NATIVE)
        openai = await http.post("/v1/completions", json=_completion())
        tgi = await http.post("/generate", json={"inputs": "hi"})
        scraped = await scrape(http)
    assert native.status_code == openai.status_code == tgi.status_code == 503
    assert openai.json()["error"]["type"] == "server_error"
    assert tgi.json()["error_type"] == "unavailable" and "no model is known" in tgi.json()["error"]
    assert scraped.value("streampool_jobs_submitted_total") == 0


async def test_a_declared_model_without_a_live_worker_queues_its_jobs_and_says_what_they_wait_for(
    settings: Settings,
) -> None:
    async with in_process_gateway(settings) as http:
        accepted = await http.post("/v1/jobs", json=NATIVE)
        job = (await http.get(f"/v1/jobs/{accepted.json()['id']}")).json()
        first = (await http.get(f"/v1/jobs/{accepted.json()['id']}/events")).json()["events"][0]
    assert accepted.status_code == 202
    waiting = f"waiting for a worker of model {MODEL}: none is live"
    assert (job["status"], job["model"], job["waiting"], job["queue_position"]) == (
        "queued",
        MODEL,
        waiting,
        0,
    )
    assert (first["state"], first["message"]) == ("queued", waiting)


async def test_a_model_no_live_worker_serves_is_not_found_on_openai_routes(
    settings: Settings, redis_client: aioredis.Redis
) -> None:
    await _heartbeat(redis_client, settings, "fake-worker")
    async with in_process_gateway(settings) as http:
        answer = await http.post(
            "/v1/chat/completions", json={"model": "gpt-4o", "messages": [{"role": "user", "content": "hi"}]}
        )
    assert answer.status_code == 404
    assert answer.json()["error"]["code"] == "model_not_found"
    assert answer.json()["error"]["param"] == "model"


async def test_every_route_is_refused_by_a_full_queue_and_counted(
    settings: Settings, redis_client: aioredis.Redis
) -> None:
    await _heartbeat(redis_client, settings, "fake-worker")
    async with in_process_gateway(settings) as http:
        assert (await http.post("/v1/jobs", json=NATIVE)).status_code == 202  # fills the queue
        native = await http.post("/v1/jobs", json=NATIVE)
        openai = await http.post("/v1/completions", json=_completion())
        tgi = await http.post("/generate", json={"inputs": "hi"})
        scraped = await scrape(http)
    assert native.status_code == openai.status_code == tgi.status_code == 429
    assert native.json()["error_type"] == tgi.json()["error_type"] == "overloaded"
    assert openai.json()["error"]["type"] == "rate_limit_error"
    assert all(int(answer.headers["Retry-After"]) >= 1 for answer in (native, openai, tgi))
    assert scraped.value("streampool_jobs_rejected_total", reason="overloaded") == 3
    assert scraped.value("streampool_jobs_submitted_total") == 1


async def test_max_tokens_above_the_limit_is_refused_on_every_route_in_its_own_words(
    settings: Settings, redis_client: aioredis.Redis
) -> None:
    await _heartbeat(redis_client, settings, "fake-worker")
    too_many = TOKENS_LIMIT + 1
    async with in_process_gateway(settings) as http:
        native = await http.post("/v1/jobs", json={"prompt": "hi", "max_tokens": too_many})
        openai = await http.post(
            "/v1/chat/completions",
            json={
                "model": MODEL,
                "messages": [{"role": "user", "content": "hi"}],
                "max_completion_tokens": too_many,
            },
        )
        tgi = await http.post("/generate", json={"inputs": "hi", "parameters": {"max_new_tokens": too_many}})
        scraped = await scrape(http)
    assert (
        native.status_code == 422 and native.json()["error"] == f"max_tokens: must be at most {TOKENS_LIMIT}"
    )
    assert openai.status_code == 400
    assert openai.json()["error"] == {
        "message": f"max_completion_tokens: must be at most {TOKENS_LIMIT}",
        "type": "invalid_request_error",
        "param": "max_completion_tokens",
        "code": "invalid_value",
    }
    assert tgi.json() == {
        "error": f"parameters.max_new_tokens: must be at most {TOKENS_LIMIT}",
        "error_type": "validation",
        "param": "max_new_tokens",
    }
    assert tgi.status_code == 422
    assert scraped.value("streampool_jobs_submitted_total") == 0


async def test_an_idempotent_replay_is_admitted_once(settings: Settings) -> None:
    async with in_process_gateway(settings) as http:
        headers = {"Idempotency-Key": "same"}
        first = await http.post("/v1/jobs", json=NATIVE, headers=headers)
        again = await http.post("/v1/jobs", json=NATIVE, headers=headers)
        scraped = await scrape(http)
    assert first.status_code == again.status_code == 202
    assert first.json()["id"] == again.json()["id"] and again.headers["Idempotent-Replayed"] == "true"
    assert scraped.value("streampool_jobs_submitted_total") == 1


# TGI's /info, from the heartbeats


async def test_tgi_info_reports_the_dtype_the_workers_heartbeats_give(
    settings: Settings, redis_client: aioredis.Redis
) -> None:
    async with in_process_gateway(settings) as http:
        await _heartbeat(redis_client, settings, "quiet-worker")
        unknown = (await http.get("/info")).json()
        await _heartbeat(redis_client, settings, "worker-1", dtype="bfloat16")
        await _heartbeat(redis_client, settings, "worker-2", dtype="bfloat16")
        await _heartbeat(redis_client, settings, "worker-3", dtype="float32")

        async def info() -> dict[str, Any]:
            answer: dict[str, Any] = (await http.get("/info")).json()
            return answer

        # The gateway may answer from what it read up to a second ago.
        reported = await eventually(
            info, "/info counts four workers", 5, until=lambda info: info["workers"] == 4
        )
    assert unknown["model_dtype"] == "unknown"
    assert reported["model_dtype"] == "bfloat16"
    assert reported["model_id"] == MODEL and reported["workers"] == 4
    assert reported["max_total_tokens"] == 512 and reported["max_new_tokens"] == TOKENS_LIMIT


async def test_n_above_max_choices_is_refused_on_every_route_that_takes_it(
    redis_url: str, redis_client: aioredis.Redis
) -> None:
    settings = make_settings(redis_url, allow_unauthenticated=True, max_choices=2, default_model=MODEL)
    await _heartbeat(redis_client, settings, "fake-worker")
    try:
        async with in_process_gateway(settings) as http:
            native = await http.post("/v1/jobs", json={"prompt": "hi", "n": 3})
            openai = await http.post("/v1/completions", json={"model": MODEL, "prompt": "hi", "n": 3})
    finally:
        await delete_test_keys(redis_client, Keys.of(settings))
    assert native.status_code == 422 and native.json()["error"] == "n: must be at most 2"
    assert openai.status_code == 400
    assert (openai.json()["error"]["param"], openai.json()["error"]["message"]) == (
        "n",
        "n: must be at most 2",
    )
