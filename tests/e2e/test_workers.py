"""Workers: several on one queue share the jobs; heartbeats feed /health and /v1/models."""

from __future__ import annotations

import asyncio
import time

import httpx

from tests.conftest import WORKERS, System
from tests.helpers import scrape, submit, wait_for_status

IDLE_TIMEOUT = 120


async def jobs_running(worker_urls: list[str]) -> list[float]:
    async with httpx.AsyncClient(timeout=10) as http:
        scrapes = [await scrape(http, f"{url}/metrics") for url in worker_urls]
    return [scraped.value("streampool_worker_jobs_running") for scraped in scrapes]


async def test_two_workers_on_one_queue_both_take_jobs(client: httpx.AsyncClient, system: System) -> None:
    # A worker still running an earlier test's job polls the queue less often than an idle one,
    # which would then win every job: start with both idle.
    deadline = time.monotonic() + IDLE_TIMEOUT
    while any(await jobs_running(system.worker_urls)):
        assert time.monotonic() < deadline, "the workers did not become idle"
        await asyncio.sleep(0.1)
    workers: set[str] = set()
    for _ in range(100):  # jobs submitted one at a time go to whichever worker polls first
        job_id = await submit(client, prompt="Hi", max_tokens=2)
        workers.add((await wait_for_status(client, job_id, {"completed"}))["worker"])
        if len(workers) == WORKERS:
            break
        await asyncio.sleep(0.01)
    assert len(workers) == WORKERS


async def test_health_reports_live_workers(client: httpx.AsyncClient) -> None:
    answer = await client.get("/health")
    assert answer.status_code == 200
    assert answer.json() == {"status": "ok", "redis": "ok", "workers": WORKERS}


async def test_models_lists_the_served_model_in_openai_shape(
    client: httpx.AsyncClient, system: System
) -> None:
    listing = (await client.get("/v1/models")).json()
    assert listing["object"] == "list"
    assert [model["id"] for model in listing["data"]] == [system.settings.model_name]
    assert listing["data"][0]["object"] == "model"
    assert listing["data"][0]["workers"] == WORKERS


async def test_metrics_are_prometheus_text(client: httpx.AsyncClient) -> None:
    answer = await client.get("/metrics")
    assert answer.status_code == 200
    assert "streampool_jobs_submitted_total" in answer.text
