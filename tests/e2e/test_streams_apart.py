"""The whole system with the job streams on a Redis of their own (`streams_redis_url`): a gateway and
two synthetic workers, the streams on a private `redis-server`, everything else on the suite's Redis,
driven through the HTTP API by real clients (SSE, long-poll, the `openai` package).

Each worker runs one job at a time (`worker_max_jobs`), so that two long jobs keep a third queued."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator

import httpx
import openai
import pytest
import redis.asyncio as aioredis

from tests.conftest import WORKERS, System, run_system
from tests.helpers import (
    JOB_DEADLINE_SECONDS,
    LONG_PROMPT,
    poll_all,
    read_sse,
    reconnected_mid_stream,
    record,
    streamed_text,
    submit,
    wait_for_status,
)

LONG_JOB_TOKENS = 2000  # a minute on the synthetic engine: such a job ends here only when cancelled


@pytest.fixture(scope="module")
def apart(redis_url: str, streams_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[System]:
    """The system with its streams apart. Not named `system`: its tests would then count as needing the
    engine (tests/conftest.py's `pytest_collection_modifyitems`); they are `unit`, as the synthetic
    system's are."""
    yield from run_system(
        redis_url,
        tmp_path_factory,
        engine="synthetic",
        synthetic_mean_tokens=0,
        streams_redis_url=streams_url,
        worker_max_jobs=1,
    )


@pytest.fixture
async def client(apart: System) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=apart.base_url, timeout=JOB_DEADLINE_SECONDS) as http:
        yield http


@pytest.fixture
async def streams(streams_url: str) -> AsyncIterator[aioredis.Redis]:
    connection = aioredis.Redis.from_url(streams_url, decode_responses=True)
    yield connection
    await connection.aclose()


async def test_a_job_streams_from_its_own_redis_to_sse_and_long_poll_alike(
    client: httpx.AsyncClient, apart: System, redis_client: aioredis.Redis, streams: aioredis.Redis
) -> None:
    job_id = await submit(client, prompt=LONG_PROMPT, max_tokens=30, stream_step=2)
    sse, polled = await asyncio.gather(read_sse(client, job_id), poll_all(client, job_id, limit=3))
    assert [stream_id for stream_id, _ in sse] == [event.pop("id") for event in polled]
    assert [event for _, event in sse] == polled
    assert polled[-1]["type"] == "done"
    job = await wait_for_status(client, job_id, {"completed"})
    assert job["output"]["text"] == streamed_text(polled) != ""

    keys = apart.keys
    assert await redis_client.exists(keys.job(job_id)) == 1
    assert await redis_client.exists(keys.stream(job_id), keys.writer(job_id)) == 0
    assert await streams.exists(keys.stream(job_id)) == 1
    assert await streams.exists(keys.job(job_id), keys.writer(job_id)) == 0  # its writer ended with it
    assert await streams.xlen(keys.stream(job_id)) == len(polled)


async def test_a_reader_reconnecting_mid_stream_misses_nothing_and_sees_nothing_twice(
    client: httpx.AsyncClient,
) -> None:
    job_id = await submit(client, prompt=LONG_PROMPT, max_tokens=40)
    whole = await reconnected_mid_stream(client, job_id)
    assert whole[-1][1]["type"] == "done"


async def _running(client: httpx.AsyncClient, job_id: str) -> list[tuple[str, dict[str, object]]]:
    """The job's first events, up to its first delta: it runs."""
    seen = await read_sse(client, job_id, stop_after=3)  # queued, running, a delta
    assert [event["type"] for _, event in seen] == ["status", "status", "delta"]
    return seen


async def test_cancel_ends_a_running_and_a_queued_job_in_stream_and_record(
    client: httpx.AsyncClient, apart: System
) -> None:
    running = [await submit(client, prompt=LONG_PROMPT, max_tokens=LONG_JOB_TOKENS) for _ in range(WORKERS)]
    seen = [await _running(client, job_id) for job_id in running]
    queued = await submit(client, prompt=LONG_PROMPT, max_tokens=LONG_JOB_TOKENS)
    assert (await record(client, queued))["status"] == "queued"  # every worker's one slot is taken

    answer = await client.post(f"/v1/jobs/{queued}/cancel")
    assert answer.status_code == 202 and answer.json()["status"] == "cancelled", answer.text
    assert [event["type"] for _, event in await read_sse(client, queued)] == ["status", "cancelled"]

    for job_id, first in zip(running, seen, strict=True):
        answer = await client.post(f"/v1/jobs/{job_id}/cancel")
        assert answer.status_code == 202 and answer.json()["status"] == "running", answer.text
        rest = await read_sse(client, job_id, last_event_id=first[-1][0])
        assert rest[-1][1]["type"] == "cancelled"
        events = [event for _, event in first + rest]
        assert [event["seq"] for event in events] == list(range(len(events)))
        job = await wait_for_status(client, job_id, {"cancelled"})
        assert job["output"]["text"] == streamed_text(events)
    assert (await record(client, queued))["status"] == "cancelled"
    # The workers are free again: the next job runs.
    await wait_for_status(client, await submit(client, prompt="Hi", max_tokens=3), {"completed"})


async def test_the_openai_package_streams_the_whole_text(client: httpx.AsyncClient, apart: System) -> None:
    async with (
        openai.AsyncOpenAI(
            base_url=f"{apart.base_url}/v1", api_key="none", max_retries=0, timeout=JOB_DEADLINE_SECONDS
        ) as sdk,
        sdk.chat.completions.with_streaming_response.create(
            model=apart.settings.model_name,
            messages=[{"role": "user", "content": LONG_PROMPT}],
            max_tokens=25,
            stream=True,
        ) as response,
    ):
        job_id = response.headers["X-Streampool-Job-Id"]
        chunks = [chunk async for chunk in await response.parse()]
    text = "".join(chunk.choices[0].delta.content or "" for chunk in chunks if chunk.choices)
    job = await record(client, job_id)
    assert job["status"] == "completed" and job["usage"]["completion_tokens"] == 25
    assert text == job["output"]["text"] != ""
    assert chunks[-1].choices[0].finish_reason == "length"
