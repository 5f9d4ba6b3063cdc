"""The gateway's /metrics, in-process with no worker: the queue's figures read from Redis at each
scrape (and left out while Redis is down), requests counted by route template, refusals by reason."""

from __future__ import annotations

import uuid

import pytest
import redis.asyncio as aioredis
from prometheus_client import CollectorRegistry

from gateway.metrics import RelayLag
from shared.keys import Keys
from tests.conftest import delete_test_keys, make_settings
from tests.gateway.stand_ins import heartbeat
from tests.helpers import Scrape, eventually, in_process_gateway, scrape, submit
from tests.processes import free_port

MAX_BODY_BYTES = 4096


def _jobs_by_state(scraped: Scrape, model: str) -> dict[str, float]:
    return {
        state: scraped.value("streampool_jobs", model=model, state=state) for state in ("queued", "running")
    }


async def test_queue_figures_are_read_from_redis_at_each_scrape_per_model(
    redis_url: str, redis_client: aioredis.Redis
) -> None:
    """Queued jobs are each model's queue's length; running ones what its workers' heartbeats say."""
    settings = make_settings(redis_url, allow_unauthenticated=True, models=["other"])
    keys = Keys(settings.key_prefix)
    model = settings.default_model or ""
    try:
        async with in_process_gateway(settings) as http:
            await submit(http, prompt="hi")
            await submit(http, prompt="hi")
            await submit(http, prompt="hi", model="other")
            before = await scrape(http)
            await heartbeat(redis_client, keys, "worker-1", model, running_jobs=1)

            async def scraped() -> Scrape:
                return await scrape(http)

            # The gateway may answer from the heartbeats it read up to a second ago.
            after = await eventually(
                scraped, "a running job", 5, until=lambda s: _jobs_by_state(s, model)["running"] == 1
            )
    finally:
        await delete_test_keys(redis_client, keys)
    assert before.value("streampool_queue_depth", model=model) == 2
    assert before.value("streampool_queue_depth", model="other") == 1
    assert _jobs_by_state(before, model) == {"queued": 2, "running": 0}
    assert _jobs_by_state(after, "other") == {"queued": 1, "running": 0}
    assert after.value("streampool_jobs_submitted_total") == 3
    assert after.value("streampool_http_requests_total", route="/v1/jobs", status="202") == 3


async def test_metrics_answer_without_the_queue_figures_while_redis_is_down() -> None:
    settings = make_settings(f"redis://127.0.0.1:{free_port()}/0", allow_unauthenticated=True)
    async with in_process_gateway(settings) as http:
        assert (await http.get(f"/v1/jobs/{uuid.uuid4().hex}")).status_code == 503  # Redis is asked
        assert (await http.get("/v1/jobs/abc/nowhere")).status_code == 404
        scraped = await scrape(http)
    assert not {"streampool_queue_depth", "streampool_jobs"} & scraped.names()
    assert scraped.value("streampool_http_requests_total", route="/v1/jobs/{job_id}", status="503") == 1
    assert scraped.value("streampool_http_requests_total", route="other", status="404") == 1


async def test_refusals_count_by_reason_and_under_their_route() -> None:
    settings = make_settings(
        f"redis://127.0.0.1:{free_port()}/0", api_keys="a-key", max_body_bytes=MAX_BODY_BYTES
    )
    async with in_process_gateway(settings) as http:
        assert (await http.post("/v1/jobs", json={"prompt": "hi"})).status_code == 401
        assert (await http.get("/v1/jobs/abc")).status_code == 401  # a read, not a refused submission
        too_large = {"prompt": "x" * MAX_BODY_BYTES}
        answer = await http.post("/v1/jobs", json=too_large, headers={"Authorization": "Bearer a-key"})
        assert answer.status_code == 413
        scraped = await scrape(http)
    assert scraped.value("streampool_jobs_rejected_total", reason="unauthorized") == 1
    assert scraped.value("streampool_jobs_rejected_total", reason="body_too_large") == 1
    assert scraped.value("streampool_jobs_rejected_total", reason="overloaded") == 0
    assert scraped.value("streampool_http_requests_total", route="/v1/jobs", status="401") == 1
    assert scraped.value("streampool_http_requests_total", route="/v1/jobs/{job_id}", status="401") == 1
    assert scraped.value("streampool_http_requests_total", route="/v1/jobs", status="413") == 1


def test_relay_lag_counts_each_write_in_every_bucket_at_or_above_its_lag() -> None:
    lag = RelayLag()
    registry = CollectorRegistry()
    registry.register(lag)
    for seconds in (0.0005, 0.001, 0.004, 0.02, 30.0, -0.002):  # a negative lag: clocks a little apart
        lag.observe(seconds)

    def bucket(le: str) -> float | None:
        return registry.get_sample_value("streampool_relay_lag_seconds_bucket", {"le": le})

    assert [bucket(le) for le in ("0.001", "0.005", "0.02", "10.0", "+Inf")] == [3, 4, 5, 5, 6]
    assert registry.get_sample_value("streampool_relay_lag_seconds_count") == 6
    assert registry.get_sample_value("streampool_relay_lag_seconds_sum") == pytest.approx(30.0255)
