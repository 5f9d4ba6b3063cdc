"""The queue worker's intake against the real Redis: every enqueue wakes an idle worker, which takes
the job at once instead of at its backstop poll (an hour here, so only the wake-up can deliver)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from functools import partial
from typing import Any

from shared.jobstore import JobStore
from shared.lifecycle.transitions import claim
from shared.queue import QueueWorker, in_progress_key, queue_worker
from shared.redis_client import connection_pool
from shared.requests import JobRequest
from tests.helpers import eventually

REQUEST = JobRequest(prompt="The capital of France is", max_tokens=8)
MODEL = "smol"
AN_HOUR = 3600.0


def worker_of(
    store: JobStore, redis_url: str, run: Callable[[str], Awaitable[None]], max_jobs: int = 10
) -> QueueWorker:
    async def run_job(job_id: str) -> bool:
        await run(job_id)
        return True

    return queue_worker(
        run=run_job,
        claim=partial(claim, model=store.keys.model(MODEL)),
        pool=connection_pool(redis_url, "test-queue", 4, decode_responses=False),
        queue=store.keys.model(MODEL).queue,
        wakeup_channel=store.keys.model(MODEL).wakeup,
        max_jobs=max_jobs,
        poll_delay=AN_HOUR,
        job_timeout_seconds=300,
        in_progress_seconds=10,
        handle_signals=False,
    )


@contextlib.asynccontextmanager
async def running(worker: QueueWorker, store: JobStore) -> AsyncIterator[None]:
    """The worker's loop, from when it listens for wake-ups until its jobs have ended."""
    main = asyncio.create_task(worker.main())
    try:
        channel = store.keys.model(MODEL).wakeup

        async def subscribed() -> bool:  # the worker listens, after its first poll
            return bool((await store.redis.pubsub_numsub(channel))[0][1] >= 1)

        await eventually(subscribed, "the worker subscribed to wake-ups", timeout=30)
        yield
        # arq's close cancels jobs still finishing
        await asyncio.wait_for(asyncio.gather(*worker.tasks.values()), 30)
    finally:
        main.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await main
        await worker.pool.aclose(close_connection_pool=True)  # arq's close() calls a deprecated close


async def test_an_idle_worker_takes_each_job_when_its_wakeup_comes(store: JobStore, redis_url: str) -> None:
    taken: asyncio.Queue[str] = asyncio.Queue()

    async def run_job(job_id: str) -> None:
        await taken.put(job_id)

    async with running(worker_of(store, redis_url, run_job), store):
        for _ in range(2):  # the second wake-up finds the worker idle again
            job_id = (await store.submit(REQUEST, model=MODEL, max_queued=0)).job_id
            assert await asyncio.wait_for(taken.get(), 30) == job_id


async def test_a_full_worker_takes_the_next_queued_job_as_soon_as_a_slot_frees(
    store: JobStore, redis_url: str
) -> None:
    taken: asyncio.Queue[tuple[str, bool]] = asyncio.Queue()
    release = asyncio.Event()

    async def run_job(job_id: str) -> None:
        await taken.put((job_id, release.is_set()))  # whether the first job's slot had freed
        await release.wait()

    async with running(worker_of(store, redis_url, run_job, max_jobs=1), store):
        first = (await store.submit(REQUEST, model=MODEL, max_queued=0)).job_id
        assert await asyncio.wait_for(taken.get(), 30) == (first, False)
        # Its wake-up comes while the only slot is taken.
        second = (await store.submit(REQUEST, model=MODEL, max_queued=0)).job_id
        assert await store.redis.zscore(store.keys.model(MODEL).queue, second) is not None
        release.set()
        assert await asyncio.wait_for(taken.get(), 30) == (second, True)  # not taken before the slot freed


async def test_a_poll_passes_over_jobs_another_worker_has_taken(store: JobStore, redis_url: str) -> None:
    """A job stays at the head of the queue until its worker's start script removes it (these jobs never
    start one): a free worker claims the job behind it instead of stalling until its backstop poll."""
    taken: asyncio.Queue[tuple[str, str]] = asyncio.Queue()
    release = asyncio.Event()

    def worker(name: str) -> QueueWorker:
        async def run_job(job_id: str) -> None:
            await taken.put((name, job_id))
            await release.wait()

        return worker_of(store, redis_url, run_job, max_jobs=1)

    async with running(worker("one"), store), running(worker("two"), store):
        first = (await store.submit(REQUEST, model=MODEL, max_queued=0)).job_id
        first_taker, job_id = await asyncio.wait_for(taken.get(), 30)
        assert job_id == first
        second = (await store.submit(REQUEST, model=MODEL, max_queued=0)).job_id
        second_taker, job_id = await asyncio.wait_for(taken.get(), 30)
        assert (job_id, second_taker) == (second, {"one": "two", "two": "one"}[first_taker])
        assert await store.redis.zscore(store.keys.model(MODEL).queue, first) is not None  # still at the head
        release.set()


async def test_a_job_requeued_while_its_earlier_run_still_ends_here_waits_for_that_run(
    store: JobStore, redis_url: str
) -> None:
    """A reaper requeues a job whose lease lapsed while its run still goes on in this worker (frozen,
    then back): the worker claims it again, but starts the new run only once the earlier one ended."""
    claims: list[str] = []

    async def counting_claim(*args: Any, **kwargs: Any) -> list[tuple[str, int]]:
        claimed = await claim(*args, model=store.keys.model(MODEL), **kwargs)
        claims.extend(job_id for job_id, _ in claimed)
        return claimed

    runs, ends = [asyncio.Event(), asyncio.Event()], [asyncio.Event(), asyncio.Event()]
    started: list[str] = []

    async def run_job(job_id: str) -> bool:
        run = len(started)
        started.append(job_id)
        runs[run].set()
        await ends[run].wait()
        return run > 0  # the earlier run finds its job taken from it: it leaves it to arq's queue

    worker = queue_worker(
        run=run_job,
        claim=counting_claim,
        pool=connection_pool(redis_url, "test-queue", 4, decode_responses=False),
        queue=store.keys.model(MODEL).queue,
        wakeup_channel=store.keys.model(MODEL).wakeup,
        max_jobs=10,
        poll_delay=AN_HOUR,
        job_timeout_seconds=300,
        in_progress_seconds=10,
        handle_signals=False,
    )
    async with running(worker, store):
        job_id = (await store.submit(REQUEST, model=MODEL, max_queued=0)).job_id
        await asyncio.wait_for(runs[0].wait(), 30)
        # What a reaper's release does to arq's keys: the job back on its queue, its mark gone.
        await store.redis.delete(in_progress_key(job_id))
        await store.redis.zadd(store.keys.model(MODEL).queue, {job_id: 0})
        await store.redis.publish(store.keys.model(MODEL).wakeup, job_id)
        await eventually(lambda: asyncio.sleep(0, claims.count(job_id) >= 2), "the job claimed again")
        # The claim's mark is let go (the job stays queued) rather than a second run started.
        await eventually(
            lambda: store.redis.exists(in_progress_key(job_id)), "the mark let go", until=lambda n: n == 0
        )
        assert started == [job_id]
        ends[0].set()
        await asyncio.wait_for(runs[1].wait(), 30)  # the ended run's slot wakes the worker: it runs now
        assert started == [job_id, job_id]
        ends[1].set()
