"""A worker told to stop (SIGTERM) takes no new jobs, lets running ones go on for `drain_seconds`,
then hands the rest over at once: another worker resumes them, and the stopped one exits cleanly."""

from __future__ import annotations

import asyncio
import signal

import httpx
import pytest

from tests.faults.conftest import (
    WAIT_TIMEOUT,
    Pool,
    assert_one_seamless_stream,
    wait_for_tokens,
)
from tests.helpers import LONG_PROMPT, read_sse, record, streamed_token_ids, submit


@pytest.fixture(scope="module")
def pool(synthetic_pool: Pool) -> Pool:
    """On the synthetic engine: the subject is a stopping worker's drain and hand-over through the queue,
    not generation; a job resumed on the real engine is tests/faults/test_engine_death.py's."""
    return synthetic_pool


async def test_sigterm_hands_a_long_job_over_after_the_drain_time_and_exits_cleanly(
    pool: Pool, client: httpx.AsyncClient
) -> None:
    pool.ensure_workers()
    job_id = await submit(client, prompt=LONG_PROMPT, max_tokens=400, temperature=0)
    reader = asyncio.create_task(read_sse(client, job_id))
    stopping = pool.worker_named((await wait_for_tokens(client, job_id, 3))["worker"])
    pool.processes.signal(stopping, signal.SIGTERM)

    events = [event for _, event in await asyncio.wait_for(reader, WAIT_TIMEOUT)]
    assert await asyncio.to_thread(pool.workers[stopping].wait, WAIT_TIMEOUT) == 0
    assert_one_seamless_stream(events)
    resumed = [event for event in events if event["type"] == "status" and event["resumed"]]
    assert [event["attempt"] for event in resumed] == [2]
    assert events[-1]["type"] == "done"
    assert events[-1]["usage"]["completion_tokens"] == len(streamed_token_ids(events))
    job = await record(client, job_id)
    assert (job["status"], job["attempts"]) == ("completed", 2)
    assert pool.worker_named(job["worker"]) != stopping
    # Handed over by the stopping worker itself, not left for its lease to lapse.
    assert "handed back (its worker shut down): requeued" in pool.log(stopping)
