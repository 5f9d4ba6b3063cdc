"""A worker through a Redis outage: it does not die, its running job is handed back and resumed
once Redis is back (the stream stays one sequence), and it takes new jobs again by itself.

Redis here is a private redis-server with its append-only file, stopped and started again on
the same port and folder, as a restarted Redis with persistence comes back.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from subprocess import Popen
from typing import Any

import pytest
import redis.asyncio as aioredis

from shared.errors import BackendUnavailable
from shared.events import JobState, event_adapter
from shared.jobstore import JobStore
from shared.keys import Keys
from shared.requests import JobRequest
from tests.conftest import SYSTEM_START_TIMEOUT, make_settings
from tests.faults.conftest import RECOVERY, WAIT_TIMEOUT, RedisServer, assert_one_seamless_stream
from tests.helpers import LONG_PROMPT, eventually, streamed_token_ids
from tests.processes import Processes, free_port


@dataclass
class Outage:
    """A worker on a redis-server of its own, which the test stops and starts again."""

    processes: Processes
    worker: Popen[bytes]
    redis: RedisServer
    store: JobStore

    def log(self) -> str:
        return (self.processes.log_dir / "worker.log").read_text(errors="replace")

    async def during_a_job(self, until: str) -> str:
        """Run a long job and stop Redis under it until the worker logs `until` once more; the job's id."""
        request = JobRequest(prompt=LONG_PROMPT, max_tokens=120, temperature=0)
        job_id = (await self.store.submit(request, model=self.store.settings.model_name, max_queued=0)).job_id

        async def streaming() -> bool:
            return len(streamed_token_ids(await stream(self.store, job_id))) >= 5

        async def logged() -> bool:
            return self.log().count(until) > seen

        await eventually(streaming, "the job streams", WAIT_TIMEOUT)
        seen = self.log().count(until)
        await asyncio.to_thread(self.redis.stop)
        await eventually(logged, f"the worker logs {until!r}", WAIT_TIMEOUT)
        await asyncio.to_thread(self.redis.start)
        await eventually(
            lambda: ended(self.store, job_id), "the job ends after Redis came back", WAIT_TIMEOUT
        )
        return job_id


@pytest.fixture
async def outage(tmp_path: Path) -> AsyncIterator[Outage]:
    processes = Processes(tmp_path)
    redis = RedisServer(processes, free_port(), tmp_path / "redis-data")
    url = await asyncio.to_thread(redis.start)
    # A lease of 4 s, not 2: once Redis is back the resumed run must not lose its lease to a
    # machine so busy that its heartbeats (every 0.5 s) stall for 2 s; the outages last a lease.
    # The synthetic engine: the subject is Redis under a worker (test_redis_outage.py: the real engine).
    settings = make_settings(
        url, metrics_port=free_port(), engine="synthetic", **{**RECOVERY, "lease_seconds": 4.0}
    )
    worker = processes.start("worker", "worker", settings)
    client = aioredis.Redis.from_url(url, decode_responses=True)
    store = JobStore(client, Keys.of(settings), settings)

    async def has_heartbeat() -> bool:
        assert worker.poll() is None, f"the worker exited; log in {processes.log_dir}"
        return bool([name async for name in client.scan_iter(match=store.keys.worker_pattern)])

    try:
        what = f"the worker starts; log in {processes.log_dir}"
        await eventually(has_heartbeat, what, SYSTEM_START_TIMEOUT, interval=0.5)
        yield Outage(processes, worker, redis, store)
    finally:
        await client.aclose()
        await asyncio.to_thread(processes.stop_all)


async def stream(store: JobStore, job_id: str) -> list[dict[str, Any]]:
    entries = await store.redis.xrange(store.keys.stream(job_id))
    return [event_adapter.validate_json(fields["data"]).model_dump() for _, fields in entries]


async def ended(store: JobStore, job_id: str) -> bool:
    try:
        return ((await store.record(job_id)).status).terminal
    except BackendUnavailable:  # Redis may still be loading its file
        return False


async def assert_completed_as_one_resumed_stream(store: JobStore, job_id: str) -> None:
    events = await stream(store, job_id)
    assert_one_seamless_stream(events)
    assert events[-1]["type"] == "done"
    assert events[-1]["usage"]["completion_tokens"] == len(streamed_token_ids(events))
    assert [event["attempt"] for event in events if event["type"] == "status" and event["resumed"]] == [2]
    record = await store.record(job_id)
    assert (record.status, record.attempts) == (JobState.completed, 2)


async def test_a_worker_outlives_redis_restarts_and_its_jobs_resume_where_they_stopped(
    outage: Outage,
) -> None:
    # Back just after the job's steps were sent again for a whole lease: the worker hands the job
    # back itself (or its reaper released the lapsed lease a moment before), and it resumes.
    # (Back within the lease, the job goes on on its first run: test_redis_blip.py.)
    short = await outage.during_a_job(until="handing the job back")
    await assert_completed_as_one_resumed_stream(outage.store, short)
    assert "handed back (its worker lost Redis): " in outage.log()

    # Back only after the lease lapsed: a reaper releases the job, and a worker resumes it.
    long = await outage.during_a_job(until="a reaper releases it once its lease lapses")
    await assert_completed_as_one_resumed_stream(outage.store, long)
    assert f"job {long}: its worker's lease lapsed; requeued" in outage.log()

    assert outage.worker.poll() is None
    after = (
        await outage.store.submit(
            JobRequest(prompt="The capital of France is", max_tokens=4),
            model=outage.store.settings.model_name,
            max_queued=0,
        )
    ).job_id
    await eventually(
        lambda: ended(outage.store, after), "a job submitted after the outages runs", WAIT_TIMEOUT
    )
    assert (await outage.store.record(after)).status is JobState.completed
