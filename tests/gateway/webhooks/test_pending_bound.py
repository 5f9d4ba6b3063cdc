"""The bound on deliveries under way is each tenant's own, through a real gateway process on the real
Redis and real receivers on loopback: jobs are submitted and cancelled over HTTP (a cancelled queued
job ends at once, announcing its end), so no worker is needed."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis.asyncio as aioredis

from gateway.webhooks.sender import TOO_MANY
from tests.gateway.keyed_gateway import KeyedGateway, bearer, run_gateway
from tests.gateway.webhooks.receiver import Receiver, new_secret, receiving
from tests.helpers import eventually

KEY_A, KEY_B = (f"sk-{name}-{uuid.uuid4().hex}" for name in ("a", "b"))
SECRET_A, SECRET_B = new_secret(), new_secret()
BOUND = 5
FLOOD = 3 * BOUND


@pytest.fixture
def receiver_a() -> Iterator[Receiver]:
    with receiving(SECRET_A) as receiver:
        yield receiver


@pytest.fixture
def receiver_b() -> Iterator[Receiver]:
    with receiving(SECRET_B) as receiver:
        yield receiver


@pytest.fixture
def gateway(
    redis_url: str, tmp_path: Path, receiver_a: Receiver, receiver_b: Receiver
) -> Iterator[KeyedGateway]:
    (tmp_path / "keys.toml").write_text(
        f'[[tenants]]\nname = "team-a"\n\n[[tenants]]\nname = "team-b"\n\n'
        f'[[keys]]\nkey = "{KEY_A}"\ntenant = "team-a"\nwebhook_secret = "{SECRET_A}"\n\n'
        f'[[keys]]\nkey = "{KEY_B}"\ntenant = "team-b"\nwebhook_secret = "{SECRET_B}"\n'
    )
    yield from run_gateway(
        redis_url,
        tmp_path,
        api_keys_file=tmp_path / "keys.toml",
        webhook_allowed_prefixes=[receiver_a.url, receiver_b.url],
        webhook_first_retry_seconds=0.2,
        webhook_max_retry_gap_seconds=1.0,
        webhook_max_pending_per_tenant=BOUND,
    )


@pytest.fixture
async def http(gateway: KeyedGateway) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=gateway.base_url, timeout=30) as client:
        yield client


async def ended(http: httpx.AsyncClient, key: str, webhook: str) -> str:
    """A job with `webhook`, cancelled while queued: its end is announced at once."""
    answer = await http.post(
        "/v1/jobs", json={"prompt": "hi", "max_tokens": 8, "webhook": webhook}, headers=bearer(key)
    )
    assert answer.status_code == 202, answer.text
    job_id: str = answer.json()["id"]
    assert (await http.post(f"/v1/jobs/{job_id}/cancel", headers=bearer(key))).status_code == 202
    return job_id


async def record(http: httpx.AsyncClient, key: str, job_id: str) -> dict[str, Any]:
    answer = await http.get(f"/v1/jobs/{job_id}/webhook", headers=bearer(key))
    assert answer.status_code == 200, answer.text
    body: dict[str, Any] = answer.json()
    return body


async def test_a_tenant_past_its_bound_gives_up_only_its_own_deliveries(
    http: httpx.AsyncClient,
    gateway: KeyedGateway,
    redis_client: aioredis.Redis,
    receiver_a: Receiver,
    receiver_b: Receiver,
) -> None:
    """team-b's one delivery is waiting for its retry, the oldest under way, when team-a's failing
    receiver has three times the bound of deliveries pending: team-a's oldest are given up, and
    team-b's is delivered once its receiver is back."""
    receiver_a.status = receiver_b.status = 503
    job_b = await ended(http, KEY_B, receiver_b.url)
    waiting = await eventually(
        lambda: record(http, KEY_B, job_b), "team-b's first attempt failed", until=lambda r: r["attempts"]
    )
    assert waiting["status"] == "pending" and waiting["last_status"] == 503

    jobs_a = [await ended(http, KEY_A, receiver_a.url) for _ in range(FLOOD)]

    async def records_a() -> list[dict[str, Any]]:
        return [await record(http, KEY_A, job_id) for job_id in jobs_a]

    expected = ["failed"] * (FLOOD - BOUND) + ["pending"] * BOUND
    bounded = await eventually(
        records_a,
        "team-a's oldest deliveries given up",
        until=lambda bodies: [body["status"] for body in bodies] == expected,
    )
    given_up = bounded[: FLOOD - BOUND]
    assert {(body["last_error"], body["next_attempt_at"]) for body in given_up} == {(TOO_MANY, None)}
    kept = await record(http, KEY_B, job_b)
    assert kept["status"] == "pending", kept
    assert await redis_client.xlen(gateway.keys.webhooks) == BOUND + 1
    assert await redis_client.zcard(gateway.keys.tenant_webhooks("team-a")) == BOUND

    receiver_b.status = None
    delivered = await eventually(
        lambda: record(http, KEY_B, job_b),
        "team-b's delivery after its receiver recovered",
        until=lambda r: r["status"] == "delivered",
    )
    assert delivered["attempts"] >= 2 and delivered["last_status"] == 204
    assert [delivery.status for delivery in receiver_b.got()] == [503] * (delivered["attempts"] - 1) + [204]
