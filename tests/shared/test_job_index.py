"""The job index the console lists jobs from, on the real Redis: written with each job, bounded, read newest
first with its filters."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from gateway.console import JobFilter, list_jobs
from shared.events import JobState
from shared.jobstore import JobStore
from shared.requests import JobRequest

REQUEST = JobRequest(prompt="Hi", max_tokens=4)


async def submit(store: JobStore, model: str = "smol") -> str:
    """A job submitted a few ms after the one before: the index scores by ms, and ties sort by id."""
    await asyncio.sleep(0.003)
    return (await store.submit(REQUEST, model=model, max_queued=0)).job_id


async def test_each_submission_enters_the_index_and_the_oldest_leave_beyond_its_size(
    store_factory: Callable[..., JobStore],
) -> None:
    store = store_factory(job_index_size=3)
    ids = [await submit(store) for _ in range(5)]
    index = await store.redis.zrange(store.keys.job_index, 0, -1)
    assert index == ids[-3:]  # scored by submission: the two oldest were trimmed
    assert 0 < await store.redis.ttl(store.keys.job_index) <= store.settings.job_lifetime_seconds


async def test_a_store_with_no_index_writes_none(store_factory: Callable[..., JobStore]) -> None:
    store = store_factory(job_index_size=0)
    await store.submit(REQUEST, model="smol", max_queued=0)
    assert await store.redis.exists(store.keys.job_index) == 0


async def test_the_list_filters_by_state_model_and_age_newest_first(store: JobStore) -> None:
    first = await submit(store)
    other = await submit(store, "other")
    cancelled = await submit(store)
    await store.cancel(cancelled)
    redis, keys = store.redis, store.keys

    listed = await list_jobs(redis, keys, JobFilter())
    assert [row.id for row in listed.data] == [cancelled, other, first]
    assert listed.scanned == 3
    queued = await list_jobs(redis, keys, JobFilter(state=JobState.queued, model="smol"))
    assert [row.id for row in queued.data] == [first]
    assert queued.data[0].status is JobState.queued and queued.data[0].model == "smol"
    ended = await list_jobs(redis, keys, JobFilter(state=JobState.cancelled))
    assert [(row.id, row.token_count) for row in ended.data] == [(cancelled, 0)]
    assert [row.id for row in (await list_jobs(redis, keys, JobFilter(limit=1))).data] == [cancelled]
    assert (await list_jobs(redis, keys, JobFilter(tenant="acme"))).data == []

    await redis.zadd(keys.job_index, {"0" * 32: 1})  # a job whose record expired long ago
    assert [row.id for row in (await list_jobs(redis, keys, JobFilter())).data] == [cancelled, other, first]
    assert await redis.zscore(keys.job_index, "0" * 32) is None  # dropped as the list read it
    assert (await list_jobs(redis, keys, JobFilter(max_age=3600))).scanned == 3  # the old entry was not read


async def test_running_jobs_are_listed_from_the_set_of_running_jobs(store: JobStore) -> None:
    job_id = (await store.submit(REQUEST, model="smol", max_queued=0)).job_id
    assert await store.start(job_id, "worker-1", "smol", lease_seconds=30) is not None
    [row] = (await list_jobs(store.redis, store.keys, JobFilter(state=JobState.running))).data
    assert (row.id, row.status, row.worker) == (job_id, JobState.running, "worker-1")
    assert row.started_at is not None and row.started_at >= row.created_at
