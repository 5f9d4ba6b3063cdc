"""The one module that knows arq: its key names and payloads are arq's own, a job the worker leaves
stays in arq's queue (arq is told to retry it, not to finish it), and start-up is left to
`on_startup` (the worker's waits there for Redis), which a stop ends cleanly also with Redis down."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from functools import partial
from signal import SIGTERM
from typing import Any

import pytest
from arq.constants import in_progress_key_prefix, job_key_prefix, retry_key_prefix
from arq.jobs import deserialize_job
from arq.worker import Retry

from shared.keys import Keys
from shared.lifecycle.transitions import claim
from shared.queue import JOB_FUNCTION, QueueWorker, job_payload, queue_worker
from shared.redis_client import connection_pool
from tests.processes import free_port


def test_keys_name_arqs_own_keys_of_a_job() -> None:
    keys = Keys("test")
    assert keys.arq_job("j1") == job_key_prefix + "j1"
    assert keys.arq_in_progress("j1") == in_progress_key_prefix + "j1"
    assert keys.arq_retry("j1") == retry_key_prefix + "j1"


def test_a_payload_is_the_job_arq_would_have_enqueued() -> None:
    job = deserialize_job(job_payload("j1", 1700000000.5))
    assert (job.function, job.args, job.kwargs, job.enqueue_time.timestamp()) == (
        JOB_FUNCTION,
        ("j1",),
        {},
        1700000000.5,
    )


def worker_on(url: str, run: Callable[[str], Awaitable[bool]], **hooks: Any) -> QueueWorker:
    """A worker of one job at a time on `url`, without signal handlers; `hooks`: on_startup, on_shutdown."""
    return queue_worker(
        run=run,
        claim=partial(claim, model=Keys("test").model("m")),
        pool=connection_pool(url, "test-queue", 1, decode_responses=False),
        queue="test:queue",
        wakeup_channel="test:queue:wakeup",
        max_jobs=1,
        poll_delay=1,
        job_timeout_seconds=10,
        in_progress_seconds=10,
        handle_signals=False,
        **hooks,
    )


@pytest.mark.parametrize("over", [True, False])
async def test_a_job_the_worker_leaves_is_retried_by_arq_not_finished(over: bool) -> None:
    async def run(job_id: str) -> bool:
        return over

    worker = worker_on("redis://127.0.0.1:6379/0", run)
    job_function = worker.functions[JOB_FUNCTION].coroutine
    if over:
        assert await job_function({}, "j1") is None
    else:
        with pytest.raises(Retry):
            await job_function({}, "j1")


async def test_a_worker_stopped_in_its_start_up_while_redis_is_down_shuts_down_without_an_error() -> None:
    started, shut_down = asyncio.Event(), asyncio.Event()

    async def startup() -> None:  # as the worker's start-up waits for a Redis that does not answer
        started.set()
        await asyncio.Event().wait()

    async def shutdown() -> None:
        shut_down.set()

    nowhere = f"redis://127.0.0.1:{free_port()}/0"
    worker = worker_on(
        nowhere, lambda job_id: asyncio.sleep(0, True), on_startup=startup, on_shutdown=shutdown
    )
    worker.main_task = asyncio.create_task(worker.main())
    await asyncio.wait_for(started.wait(), 10)  # arq would have read Redis first, and ended there
    worker.handle_sig(SIGTERM)  # what arq's signal handler does
    with pytest.raises(asyncio.CancelledError):
        await worker.main_task
    await asyncio.wait_for(worker.close(), 10)  # arq's close would raise: Redis does not answer
    assert shut_down.is_set()
