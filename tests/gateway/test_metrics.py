"""The gateway's /metrics: in-process with no worker, the queue's figures read from Redis at each
scrape (and left out while Redis is down), requests counted by route template, refusals by reason;
on real gateway processes with a tenant, its series only for the metrics token."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import httpx
import pytest
import redis.asyncio as aioredis
from prometheus_client import CollectorRegistry

from gateway.metrics import GatewayMetrics, RelayLag
from shared.keys import Keys
from tests.conftest import delete_test_keys, make_settings
from tests.gateway.keyed_gateway import KeyedGateway, bearer, run_gateway
from tests.gateway.stand_ins import heartbeat
from tests.helpers import Scrape, eventually, in_process_gateway, scrape, submit
from tests.processes import free_port

MAX_BODY_BYTES = 4096
TENANT = f"team-{uuid.uuid4().hex[:8]}"
TENANT_KEY = f"sk-{uuid.uuid4().hex}"
METRICS_TOKEN = f"metrics-{uuid.uuid4().hex}"


def _jobs_by_state(scraped: Scrape, model: str) -> dict[str, float]:
    return {
        state: scraped.value("streampool_jobs", model=model, state=state) for state in ("queued", "running")
    }


async def test_queue_figures_are_read_from_redis_at_each_scrape_per_model(
    redis_url: str, redis_client: aioredis.Redis
) -> None:
    """Queued jobs are each model's queue's length; running ones what its workers' heartbeats say."""
    settings = make_settings(redis_url, allow_unauthenticated=True, models=["other"])
    keys = Keys.of(settings)
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


async def test_a_plain_poll_is_refused_and_counted_as_a_poll_fastapi_reads() -> None:
    """A plain long-poll is answered outside the middlewares (`gateway.plain_polls`), one with values
    written otherwise (`0.0e0`) through them: each refusal is the same both ways, and counted under the
    events route's template. A body past the limit goes through the body limit both ways."""
    settings = make_settings(
        f"redis://127.0.0.1:{free_port()}/0", api_keys="a-key", max_body_bytes=MAX_BODY_BYTES
    )
    key = {"Authorization": "Bearer a-key"}
    events = f"/v1/jobs/{uuid.uuid4().hex}/events"
    cases = [  # (path, headers, body, status)
        (events, {}, b"", 401),
        ("/v1/jobs/not-a-job-id/events", key, b"", 404),
        (events, key, b"", 503),  # Redis is asked
        (events, key, b"x" * (MAX_BODY_BYTES + 1), 413),
    ]
    async with in_process_gateway(settings) as http:
        for path, headers, body, status in cases:
            plain, other = [
                await http.request("GET", path, params={"wait": wait}, headers=headers, content=body)
                for wait in ("0", "0.0e0")
            ]
            assert plain.status_code == other.status_code == status, path
            assert plain.content == other.content
            assert plain.headers.get("www-authenticate") == other.headers.get("www-authenticate")
        scraped = await scrape(http)
    for _, _, _, status in cases:
        counted = scraped.value(
            "streampool_http_requests_total", route="/v1/jobs/{job_id}/events", status=str(status)
        )
        assert counted == 2, status


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


def _tenant_gateway(redis_url: str, folder: Path, **overrides: object) -> Iterator[KeyedGateway]:
    """A gateway process whose one key is `TENANT`'s."""
    keys_file = folder / "keys.toml"
    keys_file.write_text(
        f'[[tenants]]\nname = "{TENANT}"\n\n[[keys]]\nkey = "{TENANT_KEY}"\ntenant = "{TENANT}"\n'
    )
    yield from run_gateway(redis_url, folder, api_keys_file=keys_file, **overrides)


@pytest.fixture(scope="module")
def tokened(redis_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[KeyedGateway]:
    yield from _tenant_gateway(redis_url, tmp_path_factory.mktemp("tokened"), metrics_token=METRICS_TOKEN)


@pytest.fixture(scope="module")
def tokenless(redis_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[KeyedGateway]:
    yield from _tenant_gateway(redis_url, tmp_path_factory.mktemp("tokenless"))


async def _with_tenant_figures(
    gateway: KeyedGateway, redis_client: aioredis.Redis
) -> AsyncIterator[httpx.AsyncClient]:
    """A client of `gateway` once `TENANT` has a job submitted and ended tokens counted in Redis."""
    async with httpx.AsyncClient(base_url=gateway.base_url, timeout=30) as http:
        answer = await http.post("/v1/jobs", json={"prompt": "hi"}, headers=bearer(TENANT_KEY))
        assert answer.status_code == 202, answer.text
        totals = {f"{TENANT}:tokens": 42, f"{TENANT}:jobs": 1}
        await redis_client.hset(gateway.keys.tenant_totals, mapping=totals)  # type: ignore[misc]
        yield http


@pytest.fixture
async def tokened_http(
    tokened: KeyedGateway, redis_client: aioredis.Redis
) -> AsyncIterator[httpx.AsyncClient]:
    async for http in _with_tenant_figures(tokened, redis_client):
        yield http


@pytest.fixture
async def tokenless_http(
    tokenless: KeyedGateway, redis_client: aioredis.Redis
) -> AsyncIterator[httpx.AsyncClient]:
    async for http in _with_tenant_figures(tokenless, redis_client):
        yield http


def _names_no_tenant(answer: httpx.Response) -> None:
    assert answer.status_code == 200, answer.text
    assert TENANT not in answer.text and "streampool_tenant" not in answer.text
    assert not [name for name, labels in Scrape(answer.text).samples if "tenant" in dict(labels)]
    assert Scrape(answer.text).value("streampool_jobs_submitted_total") >= 1  # the others are served


async def test_without_the_metrics_token_metrics_name_no_tenant(tokened_http: httpx.AsyncClient) -> None:
    _names_no_tenant(await tokened_http.get("/metrics"))


@pytest.mark.parametrize("token", [f"{METRICS_TOKEN}x", TENANT_KEY], ids=["wrong-token", "api-key"])
async def test_another_token_than_the_metrics_token_answers_401(
    tokened_http: httpx.AsyncClient, token: str
) -> None:
    answer = await tokened_http.get("/metrics", headers=bearer(token))
    assert answer.status_code == 401
    assert answer.json()["error_type"] == "unauthorized"
    assert TENANT not in answer.text


async def test_the_metrics_token_is_shown_the_tenants_series(tokened_http: httpx.AsyncClient) -> None:
    scraped = await scrape(tokened_http, token=METRICS_TOKEN)
    assert scraped.value("streampool_tenant_jobs_submitted_total", tenant=TENANT) >= 1
    assert scraped.value("streampool_tenant_tokens_total", tenant=TENANT) == 42
    assert scraped.value("streampool_tenant_jobs_ended_total", tenant=TENANT) == 1
    assert scraped.value("streampool_jobs_submitted_total") >= 1


@pytest.mark.parametrize(
    "headers", [{}, bearer(TENANT_KEY), bearer(METRICS_TOKEN)], ids=["none", "api-key", "would-be-token"]
)
async def test_without_a_metrics_token_set_no_caller_is_shown_a_tenant(
    tokenless_http: httpx.AsyncClient, headers: dict[str, str]
) -> None:
    _names_no_tenant(await tokenless_http.get("/metrics", headers=headers))


def test_no_series_of_the_public_registry_is_labelled_by_tenant() -> None:
    """The rule the route relies on: whatever is added to the public registry, a tenant label is not."""
    metrics = GatewayMetrics()
    metrics.tenant_jobs_submitted.labels(tenant="t").inc()
    metrics.rejected_by_tenant("t", "max_queued_jobs")
    metrics.tenant_totals.totals = {"t:tokens": "1", "t:jobs": "1"}
    public = [sample for family in metrics.registry.collect() for sample in family.samples]
    tenanted = [sample for family in metrics.tenant_registry.collect() for sample in family.samples]
    assert public and not [sample for sample in public if "tenant" in sample.labels]
    assert {sample.labels["tenant"] for sample in tenanted} == {"t"}
