"""Job ids have one format; any other path segment is an unknown job, before Redis is asked.

A job's keys are named after its id, so before this check `<id>:events` named the job's stream
where a route read its record, and Redis answered WRONGTYPE (a 500). The ids here are a real job's
with each suffix of the key layout, while each of those keys exists.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx
import pytest
import redis.asyncio as aioredis

from gateway.deps import JOB_ID
from gateway.processes import each_process_settings
from gateway.services import own_notice_partition
from shared.config import GatewaySettings, Settings
from shared.jobstore import JobStore
from shared.keys import Keys
from shared.requests import JobRequest
from tests.conftest import delete_test_keys, make_settings
from tests.helpers import in_process_gateway, submit

LAYOUT_SUFFIXES = [":events", ":cancel", ":lease"]  # the stream, and two string keys (shared/keys.py)
OTHER_FORMS = ["A" * 32, "0" * 31, "0" * 33, "12345678-1234-1234-1234-123456789abc", "x" * 10_000]


@pytest.fixture
async def settings(redis_url: str, redis_client: aioredis.Redis) -> AsyncIterator[Settings]:
    settings = make_settings(redis_url, allow_unauthenticated=True)
    yield settings
    await delete_test_keys(redis_client, Keys.of(settings))


@pytest.fixture
async def running_job(gateway: httpx.AsyncClient, settings: Settings, redis_client: aioredis.Redis) -> str:
    """A job whose stream, lease and cancel keys all exist: started by a stand-in worker, cancel asked."""
    job_id = await submit(gateway, prompt="crafted ids", max_tokens=4)
    store = JobStore(redis_client, Keys.of(settings), settings)
    assert await store.start(job_id, "stand-in-worker", "model", lease_seconds=60) is not None
    assert (await gateway.post(f"/v1/jobs/{job_id}/cancel")).status_code == 202
    for key in (store.keys.stream(job_id), store.keys.cancel(job_id), store.keys.lease(job_id)):
        assert await redis_client.exists(key)
    return job_id


def _routes(job_id: str) -> list[tuple[str, str, dict[str, str]]]:
    events = f"/v1/jobs/{job_id}/events"
    return [
        ("GET", f"/v1/jobs/{job_id}", {}),
        ("POST", f"/v1/jobs/{job_id}/cancel", {}),
        ("GET", events, {}),
        ("GET", events, {"Accept": "text/event-stream"}),
    ]


@pytest.mark.parametrize("suffix", LAYOUT_SUFFIXES)
async def test_an_id_naming_another_key_of_the_job_is_an_unknown_job(
    gateway: httpx.AsyncClient, running_job: str, suffix: str
) -> None:
    for method, path, headers in _routes(f"{running_job}{suffix}"):
        answer = await gateway.request(method, path, headers=headers)
        assert answer.status_code == 404, (method, path, answer.text)
        assert answer.json()["error_type"] == "not_found"


@pytest.mark.parametrize("job_id", OTHER_FORMS, ids=lambda job_id: job_id[:40])
async def test_an_id_of_another_form_is_an_unknown_job(gateway: httpx.AsyncClient, job_id: str) -> None:
    for method, path, headers in _routes(job_id):
        answer = await gateway.request(method, path, headers=headers)
        assert answer.status_code == 404, (method, path, answer.text)
        assert answer.json()["error_type"] == "not_found"


async def test_the_job_store_makes_ids_of_the_one_format(store_factory: type[JobStore]) -> None:
    store = store_factory()
    submission = await store.submit(JobRequest(prompt="an id", max_tokens=1), model="model", max_queued=0)
    assert JOB_ID.fullmatch(submission.job_id)


async def test_a_gateway_gives_the_jobs_it_submits_ids_in_its_own_notice_partition(
    redis_url: str, redis_client: aioredis.Redis
) -> None:
    """So that a gateway whose clients follow the jobs they submitted through it hears the notices of
    its own partition only; ids stay of the one format."""
    settings = make_settings(redis_url, allow_unauthenticated=True, gateway_notice_partition=21)
    keys = Keys.of(settings)
    async with in_process_gateway(settings) as gateway:
        job_ids = [await submit(gateway, prompt=f"own partition {n}", max_tokens=1) for n in range(5)]
    await delete_test_keys(redis_client, keys)
    assert {keys.notice_partition(job_id) for job_id in job_ids} == {21 % keys.notice_partitions}
    assert all(JOB_ID.fullmatch(job_id) for job_id in job_ids)


def test_gateway_processes_on_one_port_take_the_partitions_one_after_the_other() -> None:
    settings = GatewaySettings(gateway_notice_partition=5, processes=3)
    keys = Keys.of(settings)
    assert [own_notice_partition(each, keys) for each in each_process_settings(settings)] == [5, 6, 7]
    drawn = each_process_settings(GatewaySettings(processes=keys.notice_partitions))
    assert sorted(own_notice_partition(each, keys) for each in drawn) == list(range(keys.notice_partitions))
