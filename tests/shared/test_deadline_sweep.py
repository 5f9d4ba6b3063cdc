"""Deadlines without a worker: the gateways' sweep (`JobStore.expire_due`, `expire.lua`) ends a queued job
past its deadline as a worker's start would (failed, `deadline_exceeded`, never run), only such a job and
only once; on one Redis and with the job streams on a Redis of their own."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from datetime import datetime, timezone

import pytest
import redis.asyncio as aioredis

from shared.events import JobState
from shared.jobstore import DEADLINE_EXCEEDED, DEADLINE_PASSED, JobStore
from shared.keys import Keys
from shared.requests import JobRequest
from tests.conftest import UNIT_RETENTION_SECONDS, delete_test_keys, make_settings
from tests.shared.transitions import MODEL, WORKER, claimed

REQUEST = JobRequest(prompt="The capital of France is", max_tokens=8)
LEASE_SECONDS = 6.0


def at(seconds: float) -> datetime:
    return datetime.fromtimestamp(seconds, tz=timezone.utc)


@pytest.fixture(params=["one Redis", "streams apart"])
async def store(
    request: pytest.FixtureRequest, redis_client: aioredis.Redis, redis_url: str
) -> AsyncIterator[JobStore]:
    streams: aioredis.Redis | None = None
    overrides: dict[str, object] = {}
    if request.param == "streams apart":
        streams_url = request.getfixturevalue("streams_url")
        streams = aioredis.Redis.from_url(streams_url, decode_responses=True)
        overrides["streams_redis_url"] = streams_url
    settings = make_settings(redis_url, retention_seconds=UNIT_RETENTION_SECONDS, **overrides)
    made = JobStore(redis_client, Keys.of(settings), settings, streams)
    yield made
    await delete_test_keys(redis_client, made.keys)
    if streams is not None:
        await delete_test_keys(streams, made.keys)
        await streams.aclose()


async def submitted(store: JobStore, request: JobRequest = REQUEST, deadline: float | None = None) -> str:
    return (await store.submit(request, model=MODEL, max_queued=0, deadline=deadline)).job_id


async def stream_events(store: JobStore, job_id: str) -> list[tuple[str, str]]:
    """(type, data) of each entry of the job's stream."""
    entries = await store.streams.xrange(store.keys.stream(job_id))
    return [(fields["type"], fields["data"]) for _, fields in entries]


async def expired_count(store: JobStore) -> str | None:
    counted: str | None = await store.redis.hget(store.keys.jobs_expired, MODEL)  # type: ignore[misc]
    return counted


async def test_a_queued_job_past_its_deadline_fails_unrun_with_no_worker_to_start_it(store: JobStore) -> None:
    job_id = await submitted(store, REQUEST.model_copy(update={"deadline": at(time.time() - 1)}))
    assert await store.expire_due([MODEL]) == 1
    record = await store.redis.hgetall(store.keys.job(job_id))  # type: ignore[misc]
    assert (record["status"], record["error"]) == ("failed", DEADLINE_PASSED)
    assert "worker" not in record and "attempts" not in record and "started_at" not in record
    events = await stream_events(store, job_id)
    assert [kind for kind, _ in events] == ["status", "error"]
    assert f'"code":"{DEADLINE_EXCEEDED}"' in events[-1][1]
    model = store.keys.model(MODEL)
    assert await store.redis.zcard(model.queue) == 0
    assert await store.redis.zcard(model.deadlines) == 0
    assert await expired_count(store) == "1"
    # Nothing is left for a worker: a claim finds no job, a start of it is refused.
    assert await claimed(store) == []
    assert await store.start(job_id, WORKER, MODEL, lease_seconds=LEASE_SECONDS) is None
    assert await store.expire_due([MODEL]) == 0
    assert await expired_count(store) == "1"


async def test_a_deadline_still_ahead_leaves_the_job_queued_and_a_worker_runs_it(store: JobStore) -> None:
    job_id = await submitted(store, deadline=time.time() + 600)
    assert await store.expire_due([MODEL]) == 0
    assert (await store.record(job_id)).status is JobState.queued
    assert await store.redis.zcard(store.keys.model(MODEL).deadlines) == 1
    assert await store.start(job_id, WORKER, MODEL, lease_seconds=LEASE_SECONDS) is not None
    assert await store.redis.zcard(store.keys.model(MODEL).deadlines) == 0  # left with the queue


async def test_a_deadline_given_beside_the_request_applies_and_the_requests_own_comes_first(
    store: JobStore,
) -> None:
    beside = await submitted(store, deadline=time.time() - 1)
    own_ahead = await submitted(
        store, REQUEST.model_copy(update={"deadline": at(time.time() + 600)}), deadline=time.time() - 1
    )
    assert await store.expire_due([MODEL]) == 1
    assert (await store.record(beside)).status is JobState.failed
    assert (await store.record(own_ahead)).status is JobState.queued


async def test_a_cancelled_job_leaves_the_deadlines(store: JobStore) -> None:
    job_id = await submitted(store, deadline=time.time() + 600)
    await store.cancel(job_id)
    assert await store.redis.zcard(store.keys.model(MODEL).deadlines) == 0


async def test_a_worker_that_meets_a_job_past_its_deadline_ends_it_as_the_sweep_would(
    store: JobStore,
) -> None:
    job_id = await submitted(store, deadline=time.time() - 1)
    assert await store.start(job_id, WORKER, MODEL, lease_seconds=LEASE_SECONDS) is None
    record = await store.record(job_id)
    assert (record.status, record.error, record.started_at) == (JobState.failed, DEADLINE_PASSED, None)
    assert [kind for kind, _ in await stream_events(store, job_id)] == ["status", "error"]
    assert await store.redis.zcard(store.keys.model(MODEL).deadlines) == 0
    assert await expired_count(store) == "1"


async def test_gateways_sweeping_together_end_each_job_once(store: JobStore) -> None:
    jobs = [await submitted(store, deadline=time.time() - 1) for _ in range(5)]
    ended = await asyncio.gather(*(store.expire_due([MODEL]) for _ in range(3)))
    assert sum(ended) == len(jobs)
    assert await expired_count(store) == str(len(jobs))
    for job_id in jobs:
        assert [kind for kind, _ in await stream_events(store, job_id)] == ["status", "error"]
