"""Tenants' limits through a real gateway process started with a tenants file, on the real Redis.

No engine runs: a job's start and end are driven through the lifecycle scripts on the gateway's prefix,
as a worker's would be, and a live worker is a heartbeat written to Redis (the routes that wait for an
answer need one before they admit a job; it never runs one).
"""

from __future__ import annotations

import asyncio
import math
import re
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import openai
import pytest
import redis.asyncio as aioredis

from gateway.auth import owner_id
from shared.config import DEFAULT_MODEL_DIR
from shared.events import DoneEvent, JobState, Usage
from shared.jobstore import JobStore, Outcome
from shared.keys import Keys
from shared.lifecycle.transitions import ReleaseOutcome
from tests.conftest import make_settings
from tests.gateway.keyed_gateway import KEY_A, KEY_B, KeyedGateway, bearer, run_gateway
from tests.gateway.stand_ins import heartbeat
from tests.helpers import in_process_gateway, scrape
from tests.shared.transitions import WORKER, release

MODEL = DEFAULT_MODEL_DIR.name  # the gateway's default model (tests.conftest.make_settings)
TENANT_NAMES = ("queued", "running", "requests", "tokens", "burst", "urgent", "handed-back", "expired")
KEYS = {name: f"sk-{name}-{uuid.uuid4().hex}" for name in TENANT_NAMES}
OWN_KEYS = [f"sk-own-{uuid.uuid4().hex}" for _ in range(2)]  # naming no tenant
METRICS_TOKEN = f"metrics-{uuid.uuid4().hex}"
TENANTS = """
[[tenants]]
name = "default"
max_queued_jobs = 2

[[tenants]]
name = "queued"
max_queued_jobs = 3

[[tenants]]
name = "running"
max_running_jobs = 2
min_priority = 0

[[tenants]]
name = "requests"
requests_per_minute = 4

[[tenants]]
name = "tokens"
tokens_per_minute = 50
weight = 2.5
min_priority = -5

[[tenants]]
name = "burst"
max_queued_jobs = 10

[[tenants]]
name = "urgent"
default_priority = 3
min_priority = -5

[[tenants]]
name = "handed-back"
max_running_jobs = 1

[[tenants]]
name = "expired"
max_running_jobs = 1
""" + "".join(f'\n[[keys]]\nkey = "{key}"\ntenant = "{name}"\n' for name, key in KEYS.items())
TENANTS += "".join(f'\n[[keys]]\nkey = "{key}"\n' for key in OWN_KEYS)
KEY_TENANT = re.compile(r"key-[0-9a-f]{12}")
JOB = {"prompt": "hi", "max_tokens": 8}


@pytest.fixture(scope="module")
def gateway(redis_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[KeyedGateway]:
    folder = tmp_path_factory.mktemp("tenants")
    (folder / "tenants.toml").write_text(TENANTS)
    yield from run_gateway(
        redis_url, folder, api_keys_file=folder / "tenants.toml", metrics_token=METRICS_TOKEN
    )


@pytest.fixture
async def http(gateway: KeyedGateway) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=gateway.base_url, timeout=30) as client:
        yield client


@pytest.fixture
async def store(gateway: KeyedGateway, redis_client: aioredis.Redis) -> JobStore:
    """The gateway's job store, to start and end its jobs as a worker would."""
    return JobStore(redis_client, Keys.of(gateway.settings), gateway.settings)


async def submitted(http: httpx.AsyncClient, tenant: str) -> str:
    return await submitted_by(http, KEYS[tenant])


async def submitted_by(http: httpx.AsyncClient, key: str) -> str:
    answer = await http.post("/v1/jobs", json=JOB, headers=bearer(key))
    assert answer.status_code == 202, answer.text
    job_id: str = answer.json()["id"]
    return job_id


async def usage_of(http: httpx.AsyncClient, key: str) -> dict[str, Any]:
    answer = await http.get("/v1/usage", headers=bearer(key))
    assert answer.status_code == 200, answer.text
    usage: dict[str, Any] = answer.json()
    return usage


async def refused(http: httpx.AsyncClient, tenant: str, limit: str) -> httpx.Response:
    answer = await http.post("/v1/jobs", json=JOB, headers=bearer(KEYS[tenant]))
    assert answer.status_code == 429, answer.text
    body = answer.json()
    assert body["error_type"] == "rate_limited" and body["limit"] == limit
    assert body["error"].startswith(f"{limit}: ")
    return answer


async def run(store: JobStore, job_id: str, tokens: tuple[int, int] = (0, 0)) -> None:
    assert await store.start(job_id, "worker-1", MODEL, lease_seconds=30) is not None
    usage = Usage(prompt_tokens=tokens[0], completion_tokens=tokens[1])
    outcome = Outcome(JobState.completed, "text", tokens[1], usage, finish_reason="length")
    done = DoneEvent(seq=2, finish_reason="length", usage=usage)
    await store.redis.execute_command(*store.finish_commands(job_id, "worker-1", [done], outcome).record)


async def test_max_queued_jobs_answers_429_at_the_limit_and_not_before(http: httpx.AsyncClient) -> None:
    for _ in range(3):
        await submitted(http, "queued")
    answer = await refused(http, "queued", "max_queued_jobs")
    assert answer.headers["Retry-After"] == "1"


async def test_max_running_jobs_counts_jobs_until_they_end(http: httpx.AsyncClient, store: JobStore) -> None:
    first = await submitted(http, "running")
    await submitted(http, "running")
    await refused(http, "running", "max_running_jobs")
    await run(store, first)
    await submitted(http, "running")
    await refused(http, "running", "max_running_jobs")


async def usage_counts(http: httpx.AsyncClient, tenant: str) -> dict[str, int]:
    usage = (await http.get("/v1/usage", headers=bearer(KEYS[tenant]))).json()["usage"]
    return {name: usage[name] for name in ("queued_jobs", "running_jobs")}


async def test_a_job_handed_back_and_cancelled_ends_at_once_and_frees_its_slot(
    http: httpx.AsyncClient, store: JobStore
) -> None:
    job_id = await submitted(http, "handed-back")
    assert await store.start(job_id, WORKER, MODEL, lease_seconds=30) is not None
    # Its worker drains and hands it back; no worker of its model comes again.
    assert await release(store, job_id, attempt=1, model=MODEL) is ReleaseOutcome.requeued
    assert await usage_counts(http, "handed-back") == {"queued_jobs": 1, "running_jobs": 0}
    await refused(http, "handed-back", "max_running_jobs")

    cancelled = await http.post(f"/v1/jobs/{job_id}/cancel", headers=bearer(KEYS["handed-back"]))
    assert cancelled.status_code == 202 and cancelled.json()["status"] == "cancelled", cancelled.text
    job = (await http.get(f"/v1/jobs/{job_id}", headers=bearer(KEYS["handed-back"]))).json()
    assert job["status"] == "cancelled"
    assert await usage_counts(http, "handed-back") == {"queued_jobs": 0, "running_jobs": 0}
    await submitted(http, "handed-back")


async def test_a_running_job_whose_record_expired_no_longer_holds_a_slot(
    http: httpx.AsyncClient, store: JobStore
) -> None:
    job_id = await submitted(http, "expired")
    assert await store.start(job_id, WORKER, MODEL, lease_seconds=30) is not None
    await refused(http, "expired", "max_running_jobs")
    # No worker held it for the job's lifetime: its keys expired, its id still among the running.
    await store.redis.pexpire(store.keys.job(job_id), 1)
    await asyncio.sleep(0.05)
    await submitted(http, "expired")  # admitted: the gone job is not counted
    assert await usage_counts(http, "expired") == {"queued_jobs": 1, "running_jobs": 0}


async def test_requests_per_minute_answers_429_until_the_window_frees(http: httpx.AsyncClient) -> None:
    began = time.monotonic()
    for _ in range(4):
        await submitted(http, "requests")
    answer = await refused(http, "requests", "requests_per_minute")
    # The window frees a minute after the first submission, less what the submissions took (whole
    # seconds, rounded either way), however long a loaded machine took over them.
    assert 60 - math.ceil(time.monotonic() - began) - 1 <= int(answer.headers["Retry-After"]) <= 60


async def test_tokens_per_minute_counts_ended_jobs_usage(http: httpx.AsyncClient, store: JobStore) -> None:
    await run(store, await submitted(http, "tokens"), (20, 29))
    last = await submitted(http, "tokens")  # 49 of 50 tokens
    await run(store, last, (1, 0))
    answer = await refused(http, "tokens", "tokens_per_minute")
    assert 1 <= int(answer.headers["Retry-After"]) <= 60
    usage = (await http.get("/v1/usage", headers=bearer(KEYS["tokens"]))).json()
    assert usage == {
        "tenant": "tokens",
        "limits": {
            "max_queued_jobs": None,
            "max_running_jobs": None,
            "requests_per_minute": None,
            "tokens_per_minute": 50,
        },
        "weight": 2.5,
        "prompt_token_weight": 1.0,
        "output_token_weight": 2.0,
        "default_priority": 0,
        "min_priority": -5,
        "window_seconds": 60,
        "usage": {
            "queued_jobs": 0,
            "running_jobs": 0,
            "requests_last_minute": 2,
            "tokens_last_minute": 50,
            "tokens_total": 50,
            "jobs_ended_total": 2,
        },
    }
    scraped = await scrape(http, token=METRICS_TOKEN)
    assert scraped.value("streampool_tenant_tokens_total", tenant="tokens") == 50
    assert scraped.value("streampool_tenant_jobs_ended_total", tenant="tokens") == 2
    assert scraped.value("streampool_tenant_jobs_submitted_total", tenant="tokens") == 2
    rejected = scraped.value(
        "streampool_tenant_jobs_rejected_total", tenant="tokens", limit="tokens_per_minute"
    )
    assert rejected == 1
    assert not [
        name for name, labels in scraped.samples if any(KEYS["tokens"] in value for _, value in labels)
    ]


async def test_50_concurrent_submissions_admit_exactly_the_limit(http: httpx.AsyncClient) -> None:
    answers = await asyncio.gather(
        *(http.post("/v1/jobs", json=JOB, headers=bearer(KEYS["burst"])) for _ in range(50))
    )
    statuses = [answer.status_code for answer in answers]
    assert (statuses.count(202), statuses.count(429)) == (10, 40)
    usage = (await http.get("/v1/usage", headers=bearer(KEYS["burst"]))).json()["usage"]
    assert usage["queued_jobs"] == usage["requests_last_minute"] == 10


async def test_openai_and_tgi_routes_answer_429_in_their_own_shape(
    gateway: KeyedGateway, http: httpx.AsyncClient, redis_client: aioredis.Redis
) -> None:
    await heartbeat(redis_client, Keys.of(gateway.settings), "stand-in", MODEL)
    while (await http.post("/v1/jobs", json=JOB, headers=bearer(KEYS["queued"]))).status_code == 202:
        pass  # full, whatever the other tests left
    client = openai.AsyncOpenAI(base_url=f"{gateway.base_url}/v1", api_key=KEYS["queued"], max_retries=0)
    async with client:
        with pytest.raises(openai.RateLimitError) as caught:
            await client.completions.create(model=MODEL, prompt="hi", max_tokens=4)
    assert caught.value.code == "rate_limit_exceeded"
    assert isinstance(caught.value.body, dict) and caught.value.body["message"].startswith(
        "max_queued_jobs: "
    )
    assert caught.value.response.headers["Retry-After"] == "1"
    tgi = await http.post("/generate", json={"inputs": "hi"}, headers=bearer(KEYS["queued"]))
    assert tgi.status_code == 429 and tgi.json()["error"].startswith("max_queued_jobs: ")


async def priority_of(http: httpx.AsyncClient, store: JobStore, tenant: str, job: dict[str, object]) -> int:
    answer = await http.post("/v1/jobs", json=job, headers=bearer(KEYS[tenant]))
    assert answer.status_code == 202, answer.text
    return int(await store.redis.hget(store.keys.job(answer.json()["id"]), "priority"))  # type: ignore[misc]


async def test_a_jobs_priority_is_its_tenants_default_and_never_below_its_minimum(
    http: httpx.AsyncClient, store: JobStore
) -> None:
    assert await priority_of(http, store, "urgent", JOB) == 3
    assert await priority_of(http, store, "urgent", {**JOB, "priority": -5}) == -5
    assert await priority_of(http, store, "urgent", {**JOB, "priority": 100}) == 100
    too_urgent = await http.post("/v1/jobs", json={**JOB, "priority": -6}, headers=bearer(KEYS["urgent"]))
    assert too_urgent.status_code == 422  # as every invalid field of a native job
    assert too_urgent.json()["error"] == "priority: must be at least -5 for tenant urgent (lower runs first)"
    # A tenant whose operator bounds it at 0 may not go below, on the OpenAI routes too.
    client = openai.AsyncOpenAI(base_url=f"{http.base_url}/v1", api_key=KEYS["running"], max_retries=0)
    async with client:
        with pytest.raises(openai.BadRequestError) as caught:
            await client.completions.create(
                model=MODEL, prompt="hi", max_tokens=4, extra_body={"priority": -1}
            )
    assert caught.value.param == "priority"


async def test_without_keys_there_is_no_tenant_and_no_limit(redis_url: str) -> None:
    settings = make_settings(redis_url, allow_unauthenticated=True)
    async with in_process_gateway(settings) as http:
        usage = (await http.get("/v1/usage")).json()
        answers = [await http.post("/v1/jobs", json=JOB) for _ in range(3)]
        urgent = await http.post("/v1/jobs", json={**JOB, "priority": -5})
    assert urgent.status_code == 202, urgent.text  # vLLM's order, negative included, as vLLM takes it
    assert usage["tenant"] is None and usage["usage"] is None and set(usage["limits"].values()) == {None}
    assert [answer.status_code for answer in answers] == [202] * 3


async def test_keys_naming_no_tenant_are_each_a_tenant_with_the_default_tables_limits(
    http: httpx.AsyncClient,
) -> None:
    for key in OWN_KEYS:
        for _ in range(2):
            await submitted_by(http, key)
        over = await http.post("/v1/jobs", json=JOB, headers=bearer(key))
        assert over.status_code == 429 and over.json()["limit"] == "max_queued_jobs"
    usages = [await usage_of(http, key) for key in OWN_KEYS]
    assert [(usage["usage"]["queued_jobs"], usage["limits"]["max_queued_jobs"]) for usage in usages] == [
        (2, 2)
    ] * 2
    names = {usage["tenant"] for usage in usages}
    assert len(names) == 2 and all(KEY_TENANT.fullmatch(name) for name in names)


async def test_plain_keys_are_each_a_tenant_in_usage_and_in_the_queues_fair_share(
    keyed: KeyedGateway, redis_client: aioredis.Redis
) -> None:
    """Keys of STREAMPOOL_API_KEYS (`KEY_A`) and of a plain list (`KEY_B`), without a tenants file."""

    def counted(usage: dict[str, Any]) -> tuple[int, int]:
        return usage["usage"]["queued_jobs"], usage["usage"]["requests_last_minute"]

    async with httpx.AsyncClient(base_url=keyed.base_url, timeout=30) as http:
        before = {key: counted(await usage_of(http, key)) for key in (KEY_A, KEY_B)}
        jobs = {
            KEY_A: {await submitted_by(http, KEY_A) for _ in range(2)},
            KEY_B: {await submitted_by(http, KEY_B)},
        }
        after = {key: await usage_of(http, key) for key in (KEY_A, KEY_B)}
    tenants = {key: after[key]["tenant"] for key in (KEY_A, KEY_B)}
    assert len(set(tenants.values())) == 2 and all(KEY_TENANT.fullmatch(name) for name in tenants.values())
    assert set(tenants.values()).isdisjoint({KEY_A, KEY_B, owner_id(KEY_A), owner_id(KEY_B)})
    assert counted(after[KEY_A]) == (before[KEY_A][0] + 2, before[KEY_A][1] + 2)
    assert counted(after[KEY_B]) == (before[KEY_B][0] + 1, before[KEY_B][1] + 1)
    # Each key's jobs wait in its own tenant's share of the model's queue, which claims take turns among.
    shares = keyed.keys.model(MODEL).share_queue_prefix
    in_share = {
        key: {member.rpartition(":")[2] for member in await redis_client.zrange(shares + tenant, 0, -1)}
        for key, tenant in tenants.items()
    }
    assert jobs[KEY_A] <= in_share[KEY_A] and not jobs[KEY_A] & in_share[KEY_B]
    assert jobs[KEY_B] <= in_share[KEY_B] and not jobs[KEY_B] & in_share[KEY_A]
