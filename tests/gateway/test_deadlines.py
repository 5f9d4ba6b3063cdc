"""Deadlines on every route: a request past its deadline while queued ends `deadline_exceeded` without a
worker touching it, answered in its API's shape (504), and counted.

The gateways here have no worker at all: whatever ends a job, its deadline's sweep ends it. In-process
gateways with a default deadline and a quick sweep, and the clients users run (the `openai` package, and
`huggingface_hub` against the real gateway process of tests/gateway/conftest.py, whose default is off).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

import httpx
import openai
import pytest
import redis.asyncio as aioredis
from huggingface_hub import AsyncInferenceClient
from huggingface_hub.errors import OverloadedError

from gateway.deadlines import DEADLINE_HEADER
from gateway.generation import JOB_ID_HEADER
from shared.config import Settings
from shared.jobstore import DEADLINE_EXCEEDED, DEADLINE_PASSED
from shared.keys import Keys
from tests.conftest import delete_test_keys, make_settings
from tests.gateway.keyed_gateway import KeyedGateway
from tests.helpers import scrape, wait_for_status

DEFAULT_DEADLINE_SECONDS = 0.3
SOON = 0.2  # seconds of wait a test's request allows
ENDED = {"completed", "cancelled", "failed"}


@pytest.fixture
async def settings(redis_url: str, redis_client: aioredis.Redis) -> AsyncIterator[Settings]:
    made = make_settings(
        redis_url,
        allow_unauthenticated=True,
        default_queue_deadline_seconds=DEFAULT_DEADLINE_SECONDS,
        deadline_sweep_seconds=0.05,
    )
    yield made
    await delete_test_keys(redis_client, Keys.of(made))


@pytest.fixture
async def client(gateway: httpx.AsyncClient) -> AsyncIterator[openai.AsyncOpenAI]:
    """The `openai` package's client of the in-process gateway, which retries nothing (it would retry a
    504 twice by default)."""
    async with openai.AsyncOpenAI(
        base_url="http://gateway/v1", api_key="none", http_client=gateway, max_retries=0
    ) as made:
        yield made


async def newest_job(redis_client: aioredis.Redis, settings: Settings) -> str:
    """The id of the job submitted last, where the answer (an error's) does not name it."""
    (job_id,) = await redis_client.zrange(Keys.of(settings).job_index, -1, -1)
    return str(job_id)


async def unrun(gateway: httpx.AsyncClient, job_id: str) -> dict[str, Any]:
    """The job's record, once it has ended: failed past its deadline, never started by any worker."""
    job = await wait_for_status(gateway, job_id, ENDED, timeout=10)
    assert (job["status"], job["error"]) == ("failed", DEADLINE_PASSED)
    assert (job["worker"], job["started_at"], job["attempts"]) == (None, None, 0)
    return job


async def test_a_chat_completion_still_queued_at_its_deadline_is_answered_504_and_never_ran(
    gateway: httpx.AsyncClient, client: openai.AsyncOpenAI, settings: Settings, redis_client: aioredis.Redis
) -> None:
    with pytest.raises(openai.APIStatusError) as failed:
        await client.chat.completions.with_raw_response.create(
            model=settings.default_model or "",
            messages=[{"role": "user", "content": "Hello"}],
            max_tokens=4,
            extra_body={"deadline": time.time() + SOON},
        )
    assert failed.value.status_code == 504
    assert isinstance(failed.value.body, dict)
    assert failed.value.body["code"] == DEADLINE_EXCEEDED
    await unrun(gateway, await newest_job(redis_client, settings))


async def test_a_streamed_chat_past_the_deadline_its_header_gives_ends_with_the_error_chunk_then_done(
    gateway: httpx.AsyncClient, client: openai.AsyncOpenAI, settings: Settings
) -> None:
    body = {"model": settings.default_model, "messages": [{"role": "user", "content": "Hi"}], "stream": True}
    answer = await gateway.post("/v1/chat/completions", json=body, headers={DEADLINE_HEADER: str(SOON)})
    data = [line.removeprefix("data: ") for line in answer.text.splitlines() if line.startswith("data: ")]
    assert data[-1] == "[DONE]"
    assert f'"code":"{DEADLINE_EXCEEDED}"' in data[-2].replace(" ", "")
    await unrun(gateway, answer.headers[JOB_ID_HEADER])
    # The `openai` package raises it as it reads the stream.
    stream = await client.chat.completions.create(
        model=settings.default_model or "",
        messages=[{"role": "user", "content": "Hi"}],
        stream=True,
        extra_headers={DEADLINE_HEADER: str(SOON)},
    )
    with pytest.raises(openai.APIError, match="deadline passed"):
        async for _ in stream:
            pass


async def test_the_gateways_default_deadline_applies_to_a_request_that_gives_none(
    gateway: httpx.AsyncClient, client: openai.AsyncOpenAI, settings: Settings, redis_client: aioredis.Redis
) -> None:
    model = settings.default_model or ""
    before = (await scrape(gateway)).value("streampool_jobs_expired_total", model=model)
    started = time.monotonic()
    with pytest.raises(openai.APIStatusError) as failed:
        await client.completions.with_raw_response.create(
            model=model, prompt="Once upon a time", max_tokens=4
        )
    assert time.monotonic() - started >= DEFAULT_DEADLINE_SECONDS
    assert failed.value.status_code == 504
    await unrun(gateway, await newest_job(redis_client, settings))
    after = (await scrape(gateway)).value("streampool_jobs_expired_total", model=model)
    assert after == before + 1


async def test_a_deadline_further_than_the_default_lets_the_job_wait_longer(
    gateway: httpx.AsyncClient, settings: Settings
) -> None:
    answer = await gateway.post(
        "/v1/jobs", json={"prompt": "Hi", "max_tokens": 4}, headers={DEADLINE_HEADER: "60"}
    )
    job_id = answer.json()["id"]
    await asyncio.sleep(DEFAULT_DEADLINE_SECONDS + 0.5)  # past the default's deadline, sweeps later
    after_default = await gateway.get(f"/v1/jobs/{job_id}")
    assert after_default.json()["status"] == "queued"
    await gateway.post(f"/v1/jobs/{job_id}/cancel")


async def test_tgi_answers_a_job_past_its_deadline_with_its_error_shape(
    gateway: httpx.AsyncClient,
) -> None:
    body = {"inputs": "Hello", "parameters": {"max_new_tokens": 4}, "deadline": time.time() + SOON}
    whole = await gateway.post("/generate", json=body)
    assert whole.status_code == 504
    assert whole.json() == {"error": DEADLINE_PASSED, "error_type": "overloaded"}
    await unrun(gateway, whole.headers[JOB_ID_HEADER])
    streamed = await gateway.post("/generate_stream", json=body)
    assert streamed.text.strip().splitlines()[-1] == (
        f'data: {{"error":"{DEADLINE_PASSED}","error_type":"overloaded"}}'
    )


async def test_a_response_past_its_deadline_fails_with_the_error(
    gateway: httpx.AsyncClient, client: openai.AsyncOpenAI, settings: Settings
) -> None:
    created = await client.responses.create(
        model=settings.default_model or "",
        input="Hello",
        background=True,
        extra_body={"deadline": time.time() + SOON},
    )
    assert created.status == "queued"
    await unrun(gateway, created.id.removeprefix("resp_"))
    response = await client.responses.retrieve(created.id)
    assert response.status == "failed"
    assert response.error is not None and response.error.message == DEADLINE_PASSED
    # Waited for (no `background`), it answers the failed response.
    waited = await client.responses.create(
        model=settings.default_model or "", input="Hello", extra_headers={DEADLINE_HEADER: str(SOON)}
    )
    assert waited.status == "failed"
    assert waited.error is not None and waited.error.message == DEADLINE_PASSED


async def test_the_token_route_answers_a_job_past_its_deadline_504_in_vllms_shape(
    gateway: httpx.AsyncClient, settings: Settings, redis_client: aioredis.Redis
) -> None:
    body = {"token_ids": [1, 2, 3], "sampling_params": {"max_tokens": 4}, "deadline": time.time() + SOON}
    answer = await gateway.post("/inference/v1/generate", json=body)
    assert answer.status_code == 504
    assert answer.json()["error"]["message"] == DEADLINE_PASSED
    await unrun(gateway, await newest_job(redis_client, settings))


async def test_a_deadline_that_is_no_instant_or_a_header_that_is_no_wait_is_refused_before_any_job(
    gateway: httpx.AsyncClient, settings: Settings, redis_client: aioredis.Redis
) -> None:
    body = {"model": settings.default_model, "messages": [{"role": "user", "content": "Hi"}]}
    for deadline in ["tomorrow", "2030-01-01T00:00:00"]:  # the second has no time zone
        answer = await gateway.post("/v1/chat/completions", json={**body, "deadline": deadline})
        assert answer.status_code == 400, deadline
        assert answer.json()["error"]["param"] == "deadline"
        tgi = await gateway.post("/generate", json={"inputs": "Hi", "deadline": deadline})
        assert tgi.status_code == 422, deadline
    for value in ["0", "-1", "soon", "nan", "inf", "1733000000"]:  # the last: an instant, not a wait
        answer = await gateway.post("/v1/chat/completions", json=body, headers={DEADLINE_HEADER: value})
        assert answer.status_code == 400, value
        assert answer.json()["error"]["param"] == DEADLINE_HEADER
        native = await gateway.post("/v1/jobs", json={"prompt": "Hi"}, headers={DEADLINE_HEADER: value})
        assert native.status_code == 422, value
    assert await redis_client.zcard(Keys.of(settings).job_index) == 0


async def test_huggingface_hubs_client_sees_a_job_past_its_deadline_as_overloaded(
    gateway_process: KeyedGateway,
) -> None:
    """The real gateway process sweeps at its default pace (a second): the deadline is met within it."""
    client = AsyncInferenceClient(gateway_process.base_url, headers={DEADLINE_HEADER: str(SOON)})
    with pytest.raises(OverloadedError, match="deadline passed"):
        await client.text_generation("Hello", max_new_tokens=4)
    with pytest.raises(OverloadedError, match="deadline passed"):
        async for _ in await client.text_generation("Hello", max_new_tokens=4, stream=True):
            pass
