"""A worker whose engine dies (its engine-core process killed) under running jobs: it takes no job
more, hands its running ones back (each resumes on the other worker as one seamless stream), says
so on /health and exits non-zero for its supervisor to replace it. No job fails for it."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import psutil

from tests.faults.conftest import WAIT_TIMEOUT, Pool, assert_one_seamless_stream, wait_for_tokens
from tests.helpers import LONG_PROMPT, eventually, poll_all, record, submit

MAX_TOKENS = 64
BEFORE, AFTER = 4, 6  # jobs submitted before the engine dies, and while it lies dead


def engine_core(worker: psutil.Process) -> psutil.Process:
    """vLLM's engine-core process under a worker (its title is `VLLM::EngineCore`)."""
    cores = [child for child in worker.children(recursive=True) if "EngineCore" in " ".join(child.cmdline())]
    assert len(cores) == 1, [child.cmdline() for child in worker.children(recursive=True)]
    return cores[0]


def health_url(worker: psutil.Process) -> str:
    """The worker's /health: on the one port it listens on."""
    [port] = {c.laddr.port for c in worker.net_connections(kind="tcp") if c.status == psutil.CONN_LISTEN}
    return f"http://127.0.0.1:{port}/health"


async def says_engine_dead(http: httpx.AsyncClient, url: str) -> bool:
    try:
        answer = await http.get(url)
    except httpx.HTTPError:
        return False
    return answer.status_code == 503 and answer.json()["status"] == "engine_dead"


async def test_a_worker_whose_engine_died_hands_its_jobs_back_and_exits_and_no_job_fails(
    pool: Pool, client: httpx.AsyncClient
) -> None:
    pool.ensure_workers()
    body: dict[str, Any] = {"prompt": LONG_PROMPT, "max_tokens": MAX_TOKENS, "temperature": 0}
    jobs = [await submit(client, **body) for _ in range(BEFORE)]
    victim = pool.worker_named((await wait_for_tokens(client, jobs[0], 5))["worker"])
    worker = psutil.Process(pool.workers[victim].pid)
    url = health_url(worker)
    async with httpx.AsyncClient(timeout=2) as http:
        assert (await http.get(url)).status_code == 200
        unhealthy = asyncio.create_task(
            eventually(lambda: says_engine_dead(http, url), "/health says engine_dead", WAIT_TIMEOUT, 0.02)
        )
        engine_core(worker).kill()
        jobs += [await submit(client, **body) for _ in range(AFTER)]
        await unhealthy

    async def exit_code() -> int | None:
        return pool.workers[victim].poll()

    code = await eventually(exit_code, "the worker exits", WAIT_TIMEOUT, until=lambda code: code is not None)
    assert code != 0

    for job_id in jobs:
        events = await poll_all(client, job_id)
        assert_one_seamless_stream(events)
        assert events[-1]["type"] == "done", events[-1]
        job = await record(client, job_id)
        assert job["status"] == "completed"
        assert pool.worker_named(job["worker"]) != victim
    resumed = await record(client, jobs[0])  # it was streaming on the victim when the engine died
    assert resumed["attempts"] == 2
    assert "its worker's engine died" in pool.log(victim)
