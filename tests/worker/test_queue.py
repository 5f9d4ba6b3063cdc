"""The worker's queue loop against the real Redis: every enqueue wakes an idle worker (the backstop
poll is an hour here, so only the wake-up can deliver), a claim holds a job for its worker until it
starts it or lets it go, arq writes no key of its own, and start-up is left to `on_startup` (the
worker's waits there for Redis), which a stop ends cleanly also with Redis down."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from functools import partial
from signal import SIGTERM
from typing import Any

import pytest

from shared.jobstore import JobStore
from shared.keys import Keys
from shared.lifecycle.claims import claim, unclaim
from shared.redis_client import connection_pool
from shared.requests import JobRequest
from tests.helpers import arq_keys_of, eventually
from tests.processes import free_port
from worker.queue import QueueWorker, queue_worker

REQUEST = JobRequest(prompt="The capital of France is", max_tokens=8)
MODEL = "smol"
AN_HOUR = 3600.0


def worker_on(
    url: str,
    keys: Keys,
    run: Callable[[str], Awaitable[bool]],
    *,
    max_jobs: int = 10,
    worker_id: str = "worker-1",
    claim_with: Callable[..., Awaitable[list[tuple[str, int]]]] = claim,
    **hooks: Any,
) -> QueueWorker:
    """A worker of MODEL on `url`, without signal handlers; `hooks`: on_startup, on_shutdown."""
    model = keys.model(MODEL)
    return queue_worker(
        run=run,
        claim=partial(claim_with, keys=keys, model=model, worker_id=worker_id, lease_seconds=AN_HOUR),
        unclaim=partial(unclaim, keys=keys, model=model, worker_id=worker_id),
        pool=connection_pool(url, "test-queue", 4),
        queue=model.queue,
        wakeup_channel=model.wakeup,
        max_jobs=max_jobs,
        poll_delay=AN_HOUR,
        handle_signals=False,
        **hooks,
    )


def worker_of(
    store: JobStore, redis_url: str, run: Callable[[str], Awaitable[None]], **options: Any
) -> QueueWorker:
    """A worker whose runs all end their jobs."""

    async def run_job(job_id: str) -> bool:
        await run(job_id)
        return True

    return worker_on(redis_url, store.keys, run_job, **options)


@contextlib.asynccontextmanager
async def running(worker: QueueWorker, store: JobStore) -> AsyncIterator[None]:
    """The worker's loop, from when it listens for wake-ups until its jobs have ended."""
    channel = store.keys.model(MODEL).wakeup
    before = (await store.redis.pubsub_numsub(channel))[0][1]  # other workers'
    main = asyncio.create_task(worker.main())
    try:

        async def subscribed() -> bool:
            return bool((await store.redis.pubsub_numsub(channel))[0][1] > before)

        await eventually(subscribed, "the worker subscribed to wake-ups", timeout=30)
        yield
        await asyncio.wait_for(asyncio.gather(*worker.tasks.values()), 30)
    finally:
        main.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await main
        await worker.pool.aclose(close_connection_pool=True)


async def test_an_idle_worker_takes_each_job_when_its_wakeup_comes(store: JobStore, redis_url: str) -> None:
    taken: asyncio.Queue[str] = asyncio.Queue()

    async def run_job(job_id: str) -> None:
        await taken.put(job_id)

    worker = worker_of(store, redis_url, run_job)
    jobs = []
    async with running(worker, store):
        for _ in range(2):  # the second wake-up finds the worker idle again
            jobs.append((await store.submit(REQUEST, model=MODEL, max_queued=0)).job_id)
            assert await asyncio.wait_for(taken.get(), 30) == jobs[-1]
            assert await store.redis.get(store.keys.lease(jobs[-1])) == "claim:worker-1"
    # arq's queue is the model's; arq wrote no payload, mark, count or health check of its own.
    assert await arq_keys_of(store.redis, jobs) == []
    assert [name async for name in store.redis.scan_iter(match=f"{worker.queue_name}:*")] == []


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


async def test_a_poll_passes_over_jobs_another_worker_has_claimed(store: JobStore, redis_url: str) -> None:
    """A job stays at the head of the queue until its worker's start script removes it (these jobs never
    start one): a free worker claims the job behind it instead of stalling until its backstop poll."""
    taken: asyncio.Queue[tuple[str, str]] = asyncio.Queue()
    release = asyncio.Event()

    def worker(name: str) -> QueueWorker:
        async def run_job(job_id: str) -> None:
            await taken.put((name, job_id))
            await release.wait()

        return worker_of(store, redis_url, run_job, max_jobs=1, worker_id=name)

    async with running(worker("one"), store), running(worker("two"), store):
        first = (await store.submit(REQUEST, model=MODEL, max_queued=0)).job_id
        first_taker, job_id = await asyncio.wait_for(taken.get(), 30)
        assert job_id == first
        second = (await store.submit(REQUEST, model=MODEL, max_queued=0)).job_id
        second_taker, job_id = await asyncio.wait_for(taken.get(), 30)
        assert (job_id, second_taker) == (second, {"one": "two", "two": "one"}[first_taker])
        assert await store.redis.zscore(store.keys.model(MODEL).queue, first) is not None  # still at the head
        assert await store.redis.get(store.keys.lease(first)) == f"claim:{first_taker}"
        release.set()


async def test_a_job_left_unstarted_goes_to_another_worker_at_once(store: JobStore, redis_url: str) -> None:
    """A worker whose engine died stops and leaves the job it claimed unstarted: it lets go of the
    claim, and another worker takes the job now, not once the claim (an hour here) lapses."""
    taken: asyncio.Queue[str] = asyncio.Queue()
    claims: list[str] = []

    async def die(job_id: str) -> bool:
        claims.append(job_id)
        dying.fail()  # as the worker does when its engine dies
        return False

    async def keep(job_id: str) -> bool:
        await taken.put(job_id)
        return True

    dying = worker_on(redis_url, store.keys, die, worker_id="dying")
    async with running(dying, store):
        job_id = (await store.submit(REQUEST, model=MODEL, max_queued=0)).job_id
        await eventually(lambda: asyncio.sleep(0, claims == [job_id]), "the job claimed")
        await eventually(
            lambda: store.redis.exists(store.keys.lease(job_id)), "the claim let go", until=lambda n: n == 0
        )
    assert dying.failed and claims == [job_id]
    async with running(worker_on(redis_url, store.keys, keep, worker_id="staying"), store):
        assert await asyncio.wait_for(taken.get(), 30) == job_id
        assert await store.redis.get(store.keys.lease(job_id)) == "claim:staying"


async def test_a_job_requeued_while_its_earlier_run_still_ends_here_waits_for_that_run(
    store: JobStore, redis_url: str
) -> None:
    """A reaper requeues a job whose lease lapsed while its run still goes on in this worker (frozen,
    then back): the worker claims it again, but starts the new run only once the earlier one ended."""
    claims: list[str] = []

    async def counting_claim(*args: Any, **kwargs: Any) -> list[tuple[str, int]]:
        claimed = await claim(*args, **kwargs)
        claims.extend(job_id for job_id, _ in claimed)
        return claimed

    runs, ends = [asyncio.Event(), asyncio.Event()], [asyncio.Event(), asyncio.Event()]
    started: list[str] = []

    async def run_job(job_id: str) -> bool:
        run = len(started)
        started.append(job_id)
        runs[run].set()
        await ends[run].wait()
        return run > 0  # the earlier run finds its job taken from it: it leaves it to the queue

    async with running(worker_on(redis_url, store.keys, run_job, claim_with=counting_claim), store):
        job_id = (await store.submit(REQUEST, model=MODEL, max_queued=0)).job_id
        await asyncio.wait_for(runs[0].wait(), 30)
        # What a reaper's release does: the lapsed lease gone, the job back on its queue.
        await store.redis.delete(store.keys.lease(job_id))
        await store.redis.zadd(store.keys.model(MODEL).queue, {job_id: 0})
        await store.redis.publish(store.keys.model(MODEL).wakeup, job_id)
        await eventually(lambda: asyncio.sleep(0, claims.count(job_id) >= 2), "the job claimed again")
        # The claim is let go (the job stays queued) rather than a second run started.
        await eventually(
            lambda: store.redis.exists(store.keys.lease(job_id)), "the claim let go", until=lambda n: n == 0
        )
        assert started == [job_id]
        ends[0].set()
        await asyncio.wait_for(runs[1].wait(), 30)  # the ended run's slot wakes the worker: it runs now
        assert started == [job_id, job_id]
        ends[1].set()


async def test_a_worker_stopped_in_its_start_up_while_redis_is_down_shuts_down_without_an_error() -> None:
    started, shut_down = asyncio.Event(), asyncio.Event()

    async def startup() -> None:  # as the worker's start-up waits for a Redis that does not answer
        started.set()
        await asyncio.Event().wait()

    async def shutdown() -> None:
        shut_down.set()

    nowhere = f"redis://127.0.0.1:{free_port()}/0"
    worker = worker_on(
        nowhere, Keys("test"), lambda job_id: asyncio.sleep(0, True), on_startup=startup, on_shutdown=shutdown
    )
    worker.main_task = asyncio.create_task(worker.main())
    await asyncio.wait_for(started.wait(), 10)  # arq would have read Redis first, and ended there
    worker.handle_sig(SIGTERM)  # what arq's signal handler does
    with pytest.raises(asyncio.CancelledError):
        await worker.main_task
    await asyncio.wait_for(worker.close(), 10)  # arq's close would raise: Redis does not answer
    assert shut_down.is_set()


async def test_a_stop_cancels_the_running_jobs_and_the_worker_closes_cleanly(
    store: JobStore, redis_url: str
) -> None:
    """With no drain time left, a stop cancels the running jobs (they hand themselves over); their
    cancelled runs are no error of the worker's, which still runs `on_shutdown` and closes."""
    started, shut_down = asyncio.Event(), asyncio.Event()

    async def run_job(job_id: str) -> bool:
        started.set()
        await asyncio.Event().wait()
        return True

    async def shutdown() -> None:
        shut_down.set()

    worker = worker_on(redis_url, store.keys, run_job, on_shutdown=shutdown)
    worker.main_task = asyncio.create_task(worker.main())
    await store.submit(REQUEST, model=MODEL, max_queued=0)
    await asyncio.wait_for(started.wait(), 30)
    worker.handle_sig(SIGTERM)
    with pytest.raises(asyncio.CancelledError):
        await worker.main_task
    await asyncio.wait_for(worker.close(), 10)
    assert shut_down.is_set()
    assert [task.cancelled() for task in worker.tasks.values()] == [True]
