"""Workers' heartbeats feed /health and /v1/models, on workers of the synthetic engine, which heartbeat
as the real engine's do. (That several workers share one queue's jobs is
tests/scale/test_many_processes.py's check, under load: arq gives jobs submitted one at a time to
an idle system to whichever worker polls first, often the same one.)"""

from __future__ import annotations

import httpx
import openai
import pytest

from tests.conftest import WORKERS, System
from tests.helpers import read_sse, scrape, submit

SUBMITTED = "streampool_jobs_submitted_total"


@pytest.fixture(scope="module")
def system(synthetic_system: System) -> System:
    return synthetic_system


async def test_health_reports_live_workers(client: httpx.AsyncClient) -> None:
    answer = await client.get("/health")
    assert answer.status_code == 200
    assert answer.json() == {"status": "ok", "redis": "ok", "workers": WORKERS, "models": 1}


async def test_models_lists_the_served_model_in_openai_shape(
    client: httpx.AsyncClient, async_openai: openai.AsyncOpenAI, system: System
) -> None:
    listing = (await client.get("/v1/models")).json()
    assert listing["object"] == "list"
    assert [model["id"] for model in listing["data"]] == [system.settings.model_name]
    assert listing["data"][0]["object"] == "model"
    assert listing["data"][0]["workers"] == WORKERS
    assert [model.id async for model in async_openai.models.list()] == [system.settings.model_name]


async def test_metrics_are_prometheus_text_that_counts_a_submitted_job(client: httpx.AsyncClient) -> None:
    before = await scrape(client)  # parsed as Prometheus text, or this fails
    job_id = await submit(client, prompt="Hi", max_tokens=2)
    after = await scrape(client)
    # Tests run one at a time: this job is the only one submitted between the two reads.
    assert after.value(SUBMITTED) - before.value(SUBMITTED) == 1
    assert (await read_sse(client, job_id))[-1][1]["type"] == "done"  # ends before the next test
