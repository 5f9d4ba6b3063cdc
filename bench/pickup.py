"""Queue pickup: enqueue to worker start, from the job record's created_at (stamped by whoever submits,
the gateway over HTTP, just before its submit script) and started_at (stamped by the worker just before
its start script). Both are time.time() of processes on this one machine, so they share a clock."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import httpx

from bench.jobclient import submit
from bench.workload import request
from shared.jobstore import JobStore

SPACING_SECONDS = 0.02  # open loop, one job every 20 ms: pickup, not queueing behind a busy engine

Submit = Callable[[int], Awaitable[str]]
"""Submits the `n`-th tiny job (max_tokens 1); answers its id."""


def over_http(http: httpx.AsyncClient) -> Submit:
    """Each job as a client submits it: `POST /v1/jobs` to the gateway."""
    return lambda number: submit(http, request(number, max_tokens=1))


async def measure(submit_job: Submit, store: JobStore, jobs: int, on_done: Callable[[], None]) -> list[float]:
    """Pickup latencies in seconds of `jobs` tiny jobs, submitted one at a time by `submit_job`."""
    ids: list[str] = []
    for number in range(jobs):
        ids.append(await submit_job(number))
        on_done()
        await asyncio.sleep(SPACING_SECONDS)
    latencies = []
    for job_id in ids:
        while (record := await store.record(job_id)).started_at is None:
            await asyncio.sleep(0.05)
        latencies.append((record.started_at - record.created_at).total_seconds())
    return latencies
