"""The one module that knows arq: its key names and payloads are arq's own, and a job the worker leaves
stays in arq's queue (arq is told to retry it, not to finish it)."""

from __future__ import annotations

import pytest
from arq.constants import in_progress_key_prefix, job_key_prefix, retry_key_prefix
from arq.jobs import deserialize_job
from arq.worker import Retry

from shared.keys import Keys
from shared.lifecycle.transitions import claim
from shared.queue import JOB_FUNCTION, job_payload, queue_worker
from shared.redis_client import connection_pool


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


@pytest.mark.parametrize("over", [True, False])
async def test_a_job_the_worker_leaves_is_retried_by_arq_not_finished(over: bool) -> None:
    async def run(job_id: str) -> bool:
        return over

    worker = queue_worker(
        run=run,
        claim=claim,
        pool=connection_pool("redis://127.0.0.1:6379/0", "test-queue", 1, decode_responses=False),
        queue="test:queue",
        wakeup_channel="test:queue:wakeup",
        max_jobs=1,
        poll_delay=1,
        job_timeout_seconds=10,
        in_progress_seconds=10,
        handle_signals=False,
    )
    job_function = worker.functions[JOB_FUNCTION].coroutine
    if over:
        assert await job_function({}, "j1") is None
    else:
        with pytest.raises(Retry):
            await job_function({}, "j1")
