"""The queue worker's intake against the real Redis: every enqueue wakes an idle worker, which takes
the job at once instead of at its backstop poll (an hour here, so only the wake-up can deliver)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import redis.asyncio as aioredis
from arq.connections import RedisSettings
from arq.worker import func

from shared.jobstore import ARQ_FUNCTION, JobStore
from shared.requests import JobRequest
from worker.queue_worker import QueueWorker

REQUEST = JobRequest(prompt="The capital of France is", max_tokens=8)
AN_HOUR = 3600.0


async def subscribed(redis: aioredis.Redis, channel: str) -> None:
    """Until one subscriber listens on the channel (the worker, after its first poll)."""
    while (await redis.pubsub_numsub(channel))[0][1] < 1:
        await asyncio.sleep(0.01)


def queue_worker(store: JobStore, redis_url: str, run_job: Any, max_jobs: int = 10) -> QueueWorker:
    return QueueWorker(
        functions=[func(run_job, name=ARQ_FUNCTION)],
        queue_name=store.keys.queue,
        redis_settings=RedisSettings.from_dsn(redis_url),
        max_jobs=max_jobs,
        poll_delay=AN_HOUR,
        in_progress_seconds=10,
        wakeup_channel=store.keys.queue_wakeup,
        handle_signals=False,
        keep_result=0,
    )


@contextlib.asynccontextmanager
async def running(worker: QueueWorker, store: JobStore) -> AsyncIterator[None]:
    """The worker's loop, from when it listens for wake-ups until its jobs have ended."""
    main = asyncio.create_task(worker.main())
    try:
        await asyncio.wait_for(subscribed(store.redis, store.keys.queue_wakeup), 30)
        yield
        await asyncio.gather(*worker.tasks.values())  # arq's close cancels jobs still finishing
    finally:
        main.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await main
        await worker.pool.aclose(close_connection_pool=True)  # arq's close() calls a deprecated close


async def test_an_idle_worker_takes_each_job_when_its_wakeup_comes(store: JobStore, redis_url: str) -> None:
    taken: asyncio.Queue[str] = asyncio.Queue()

    async def run_job(ctx: dict[str, Any], job_id: str) -> None:
        await taken.put(job_id)

    async with running(queue_worker(store, redis_url, run_job), store):
        for _ in range(2):  # the second wake-up finds the worker idle again
            job_id = (await store.submit(REQUEST)).job_id
            assert await asyncio.wait_for(taken.get(), 30) == job_id


async def test_a_full_worker_takes_the_next_queued_job_as_soon_as_a_slot_frees(
    store: JobStore, redis_url: str
) -> None:
    taken: asyncio.Queue[str] = asyncio.Queue()
    release = asyncio.Event()

    async def run_job(ctx: dict[str, Any], job_id: str) -> None:
        await taken.put(job_id)
        await release.wait()

    async with running(queue_worker(store, redis_url, run_job, max_jobs=1), store):
        first = (await store.submit(REQUEST)).job_id
        assert await asyncio.wait_for(taken.get(), 30) == first
        second = (await store.submit(REQUEST)).job_id  # its wake-up comes while the only slot is taken
        await asyncio.sleep(0.5)
        assert taken.empty() and await store.redis.zscore(store.keys.queue, second) is not None
        release.set()
        assert await asyncio.wait_for(taken.get(), 30) == second


async def test_a_poll_passes_over_jobs_another_worker_has_taken(store: JobStore, redis_url: str) -> None:
    """A job stays at the head of the queue until its worker's start script removes it (these jobs never
    start one): a free worker claims the job behind it instead of stalling until its backstop poll."""
    taken: asyncio.Queue[tuple[str, str]] = asyncio.Queue()
    release = asyncio.Event()

    def worker(name: str) -> QueueWorker:
        async def run_job(ctx: dict[str, Any], job_id: str) -> None:
            await taken.put((name, job_id))
            await release.wait()

        return queue_worker(store, redis_url, run_job, max_jobs=1)

    async with running(worker("one"), store), running(worker("two"), store):
        first = (await store.submit(REQUEST)).job_id
        first_taker, job_id = await asyncio.wait_for(taken.get(), 30)
        assert job_id == first
        second = (await store.submit(REQUEST)).job_id
        second_taker, job_id = await asyncio.wait_for(taken.get(), 30)
        assert (job_id, second_taker) == (second, {"one": "two", "two": "one"}[first_taker])
        assert await store.redis.zscore(store.keys.queue, first) is not None  # still at the head
        release.set()
