"""A worker started before Redis answers loads its engine, then waits for Redis (saying so once, its
/health `redis_unreachable`) instead of exiting: once a Redis starts, it registers and takes jobs
with the engine it loaded; told to stop while it waits, it exits at once and cleanly.

Redis here is a private redis-server on a port nothing listens on until the test starts it.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import signal
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from subprocess import Popen

import httpx
import pytest
import redis.asyncio as aioredis

from shared.config import Settings
from shared.events import JobState
from shared.jobstore import JobStore
from shared.keys import Keys
from shared.requests import JobRequest
from tests.conftest import SYSTEM_START_TIMEOUT, make_settings
from tests.faults.conftest import RECOVERY, WAIT_TIMEOUT, RedisServer
from tests.helpers import eventually, eventually_sync
from tests.processes import Processes, free_port

WAITING = "waiting for Redis before taking jobs"
IMPATIENCE = 10.0


@dataclass
class WaitingWorker:
    """A worker whose engine has loaded, waiting for a Redis that is not running yet."""

    processes: Processes
    worker: Popen[bytes]
    redis: RedisServer
    settings: Settings

    def health(self) -> tuple[int, str] | None:
        """/health's status code and `status`; None while it does not answer (yet)."""
        try:
            answer = httpx.get(f"http://127.0.0.1:{self.settings.metrics_port}/health", timeout=5)
        except httpx.HTTPError:
            return None
        return answer.status_code, answer.json()["status"]


@contextlib.contextmanager
def started_before_redis(tmp_path: Path, **overrides: object) -> Iterator[WaitingWorker]:
    """A worker on `overrides` and a Redis not running yet, once the worker's engine has loaded and
    its /health says it waits for Redis."""
    processes = Processes(tmp_path)
    redis = RedisServer(processes, free_port(), tmp_path / "redis-data", options=())
    settings = make_settings(
        f"redis://127.0.0.1:{redis.port}/0",
        metrics_port=free_port(),
        engine="synthetic",  # the subject is Redis at start-up; test_redis_outage.py has the real engine
        **{**RECOVERY, **overrides},
    )
    worker = processes.start("worker", "worker", settings)
    waiting = WaitingWorker(processes, worker, redis, settings)

    def engine_up_and_waiting() -> bool:
        assert worker.poll() is None, f"the worker exited; log in {processes.log_dir}"
        return waiting.health() == (503, "redis_unreachable")

    try:
        what = f"the worker waits for Redis; log in {processes.log_dir}"
        eventually_sync(engine_up_and_waiting, what, SYSTEM_START_TIMEOUT, interval=0.5)
        yield waiting
    finally:
        processes.stop_all()


@pytest.fixture
def waiting_worker(tmp_path: Path) -> Iterator[WaitingWorker]:
    """One that waits for ever (the default)."""
    with started_before_redis(tmp_path) as waiting:
        yield waiting


@pytest.fixture
def impatient_worker(tmp_path: Path) -> Iterator[WaitingWorker]:
    """One that waits `IMPATIENCE` seconds at most."""
    with started_before_redis(tmp_path, redis_startup_timeout_seconds=IMPATIENCE) as waiting:
        yield waiting


async def test_a_worker_started_before_redis_waits_for_it_then_takes_jobs_on_the_engine_it_loaded(
    waiting_worker: WaitingWorker,
) -> None:
    await asyncio.sleep(5)  # long enough for tries at the backoff's longest interval
    assert waiting_worker.worker.poll() is None
    assert waiting_worker.processes.log("worker").count(WAITING) == 1

    url = await asyncio.to_thread(waiting_worker.redis.start)
    client = aioredis.Redis.from_url(url, decode_responses=True)
    store = JobStore(client, Keys.of(waiting_worker.settings), waiting_worker.settings)
    try:

        async def ready() -> bool:
            return await asyncio.to_thread(waiting_worker.health) == (200, "ready")

        await eventually(ready, "the worker is ready once Redis answers", WAIT_TIMEOUT, interval=0.2)
        assert await client.zcard(store.keys.workers) == 1  # its heartbeat
        request = JobRequest(prompt="The capital of France is", max_tokens=8, temperature=0)
        job_id = (await store.submit(request, model=waiting_worker.settings.model_name, max_queued=0)).job_id

        async def ended() -> bool:
            return (await store.record(job_id)).status.terminal

        await eventually(ended, "the job ends", WAIT_TIMEOUT, interval=0.2)
        assert (await store.record(job_id)).status is JobState.completed
    finally:
        await client.aclose()
    log = waiting_worker.processes.log("worker")
    assert log.count("starting the engine") == 1
    assert log.count("Redis answers; the worker goes on starting") == 1
    assert "Traceback" not in log


def test_a_worker_waiting_for_redis_exits_at_once_and_cleanly_on_sigterm(
    waiting_worker: WaitingWorker,
) -> None:
    waiting_worker.processes.signal("worker", signal.SIGTERM)
    # It waits for ever otherwise: ending at all is acting on the signal, and how soon is no test's to
    # time on a loaded machine.
    assert waiting_worker.worker.wait(WAIT_TIMEOUT) == 0
    log = waiting_worker.processes.log("worker")
    assert "Traceback" not in log
    assert re.search(r"worker \S+ stopped", log)  # its shutdown ran


def test_a_worker_that_waited_its_redis_startup_timeout_exits_non_zero_saying_so(
    impatient_worker: WaitingWorker,
) -> None:
    assert impatient_worker.worker.wait(IMPATIENCE + WAIT_TIMEOUT) == 1
    log = impatient_worker.processes.log("worker")
    assert "Traceback" not in log
    assert re.search(r"worker \S+ stopped", log)  # its shutdown ran: the engine is gone too
    said = [line for line in log.splitlines() if line.startswith("streampool worker: ")]
    assert len(said) == 1, said
    assert said[0].startswith("streampool worker: Redis is unreachable"), said
    assert "redis_startup_timeout_seconds" in said[0]
