"""Webhooks of several tenants through a real gateway process on the real Redis, delivered to real
receivers on loopback: jobs are submitted and cancelled over HTTP (a cancelled queued job ends at
once, announcing its end), so no worker is needed.

team-a's receiver may be made to fail every delivery; team-b may POST only under its own prefix (a
path of team-b's receiver's server); a key of no tenant has the gateway's prefix (receiver C)."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import pytest

from tests.gateway.keyed_gateway import KeyedGateway, bearer, run_gateway
from tests.gateway.webhooks.receiver import Delivery, Receiver, new_secret, receiving
from tests.helpers import eventually

KEY_A, KEY_B, KEY_C = (f"sk-{name}-{uuid.uuid4().hex}" for name in ("a", "b", "c"))
SECRET_A, SECRET_B, SECRET_C = new_secret(), new_secret(), new_secret()
JOB = {"prompt": "hi", "max_tokens": 8}
FAILING_JOBS = 300  # more than the sender's 256 slots in all
NORMAL_DELIVERY_SECONDS = 30.0
"""How long a test waits for a delivery to a receiver that answers at once: it takes milliseconds when
its sender is free, and a loaded machine must not fail it."""
HELD_DELIVERY_SECONDS = 60.0
"""How long a delivery may take beside another tenant's held ones: far less than their attempts'
timeout (the module's `webhook_timeout_seconds`), so only a delivery that never waits for them passes."""


@pytest.fixture(scope="module")
def receiver_a() -> Iterator[Receiver]:
    with receiving(SECRET_A) as receiver:
        yield receiver


@pytest.fixture(scope="module")
def receiver_b() -> Iterator[Receiver]:
    with receiving(SECRET_B) as receiver:
        yield receiver


@pytest.fixture(scope="module")
def receiver_c() -> Iterator[Receiver]:
    with receiving(SECRET_C) as receiver:
        yield receiver


@pytest.fixture(scope="module")
def gateway(
    redis_url: str,
    tmp_path_factory: pytest.TempPathFactory,
    receiver_a: Receiver,
    receiver_b: Receiver,
    receiver_c: Receiver,
) -> Iterator[KeyedGateway]:
    folder = tmp_path_factory.mktemp("webhook-tenants")
    (folder / "keys.toml").write_text(
        f'[[tenants]]\nname = "team-a"\nwebhook_allowed_prefixes = ["{receiver_a.url}"]\n\n'
        f'[[tenants]]\nname = "team-b"\nwebhook_allowed_prefixes = ["{receiver_b.url}team-b/"]\n\n'
        f'[[keys]]\nkey = "{KEY_A}"\ntenant = "team-a"\nwebhook_secret = "{SECRET_A}"\n\n'
        f'[[keys]]\nkey = "{KEY_B}"\ntenant = "team-b"\nwebhook_secret = "{SECRET_B}"\n\n'
        f'[[keys]]\nkey = "{KEY_C}"\nwebhook_secret = "{SECRET_C}"\n'
    )
    yield from run_gateway(
        redis_url,
        folder,
        api_keys_file=folder / "keys.toml",
        webhook_allowed_prefixes=[receiver_c.url],
        webhook_first_retry_seconds=0.2,
        webhook_max_retry_gap_seconds=2.0,
        webhook_timeout_seconds=2 * HELD_DELIVERY_SECONDS,
    )


@pytest.fixture
async def http(gateway: KeyedGateway) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=gateway.base_url, timeout=30) as client:
        yield client


async def submit(http: httpx.AsyncClient, key: str, webhook: str) -> httpx.Response:
    return await http.post("/v1/jobs", json={**JOB, "webhook": webhook}, headers=bearer(key))


async def ended(http: httpx.AsyncClient, key: str, webhook: str) -> str:
    """A job with `webhook`, cancelled while queued: its end is announced at once."""
    answer = await submit(http, key, webhook)
    assert answer.status_code == 202, answer.text
    job_id: str = answer.json()["id"]
    cancel = await http.post(f"/v1/jobs/{job_id}/cancel", headers=bearer(key))
    assert cancel.status_code == 202, cancel.text
    return job_id


async def record(
    http: httpx.AsyncClient, key: str, job_id: str, status: str, timeout: float
) -> dict[str, Any]:
    async def read() -> dict[str, Any]:
        answer = await http.get(f"/v1/jobs/{job_id}/webhook", headers=bearer(key))
        assert answer.status_code == 200, answer.text
        body: dict[str, Any] = answer.json()
        return body

    return await eventually(
        read, f"the webhook {status}", timeout, until=lambda body: body["status"] == status
    )


def of_job(receiver: Receiver, job_id: str) -> list[Delivery]:
    return [delivery for delivery in receiver.got() if delivery.event["data"]["id"] == job_id]


async def test_a_tenant_whose_receiver_always_fails_does_not_delay_another_tenants_webhook(
    http: httpx.AsyncClient, receiver_a: Receiver, receiver_b: Receiver
) -> None:
    """team-a's receiver holds every request it gets, then fails it: its deliveries keep every slot
    they can take for as long as the test lasts (`webhook_timeout_seconds` outlasts it), and team-b's
    delivery arrives all the same, while they are held."""
    receiver_a.status = 500
    receiver_a.answering.clear()
    try:
        limit = asyncio.Semaphore(32)

        async def failing() -> str:
            async with limit:
                return await ended(http, KEY_A, receiver_a.url)

        await asyncio.gather(*(failing() for _ in range(FAILING_JOBS)))

        async def held() -> int:
            return len(receiver_a.got())

        await eventually(held, "team-a's receiver holding its deliveries")
        job_id = await ended(http, KEY_B, f"{receiver_b.url}team-b/jobs")
        delivered = await record(http, KEY_B, job_id, "delivered", HELD_DELIVERY_SECONDS)
        assert not receiver_a.answering.is_set()  # team-a's deliveries were held all along
    finally:
        receiver_a.answering.set()
        receiver_a.status = None
    assert delivered["attempts"] == 1
    assert [delivery.status for delivery in of_job(receiver_b, job_id)] == [204]


async def test_a_404_fails_the_delivery_at_once(http: httpx.AsyncClient, receiver_c: Receiver) -> None:
    receiver_c.status = 404
    try:
        job_id = await ended(http, KEY_C, receiver_c.url)
        failed = await record(http, KEY_C, job_id, "failed", NORMAL_DELIVERY_SECONDS)
        await asyncio.sleep(1.0)  # several first-retry waits: a retry would have come
    finally:
        receiver_c.status = None
    assert failed["attempts"] == 1 and failed["last_status"] == 404 and failed["next_attempt_at"] is None
    assert [delivery.status for delivery in of_job(receiver_c, job_id)] == [404]


async def test_a_503_is_retried_after_the_wait_its_retry_after_asks(
    http: httpx.AsyncClient, receiver_c: Receiver
) -> None:
    receiver_c.failures, receiver_c.retry_after = 1, "1"
    try:
        job_id = await ended(http, KEY_C, receiver_c.url)
        delivered = await record(http, KEY_C, job_id, "delivered", NORMAL_DELIVERY_SECONDS)
    finally:
        receiver_c.failures, receiver_c.retry_after = 0, None
    assert delivered["attempts"] == 2 and delivered["last_status"] == 204
    first, second = of_job(receiver_c, job_id)
    assert (first.status, second.status) == (503, 204)
    assert second.at - first.at >= 0.9  # its Retry-After, not the first retry's 0.2 s


@pytest.mark.parametrize(
    "path",
    [
        "team-b/%2e%2e/elsewhere",
        "team-b/%2E%2E/%2e%2e/hooks/x",
        "team-b/..%2Felsewhere",
        "team-b/..%5celsewhere",
    ],
)
async def test_a_webhook_that_escapes_its_tenants_prefix_is_refused(
    http: httpx.AsyncClient, receiver_b: Receiver, path: str
) -> None:
    answer = await submit(http, KEY_B, receiver_b.url + path)
    assert answer.status_code == 400, answer.text
    assert answer.json()["error_type"] == "webhook_refused"


async def test_a_tenants_own_prefix_is_its_alone_and_what_is_checked_is_what_is_posted(
    http: httpx.AsyncClient, receiver_b: Receiver
) -> None:
    inside = f"{receiver_b.url}team-b/%7ejobs/./x"
    for key in (KEY_A, KEY_C):  # another tenant's prefixes, and the gateway's
        refused = await submit(http, key, inside)
        assert refused.status_code == 400 and "webhook_allowed_prefixes" in refused.json()["error"]
    job_id = await ended(http, KEY_B, inside)
    delivered = await record(http, KEY_B, job_id, "delivered", NORMAL_DELIVERY_SECONDS)
    assert delivered["url"] == f"{receiver_b.url}team-b/~jobs/x"
    assert [delivery.path for delivery in of_job(receiver_b, job_id)] == ["/hooks/team-b/~jobs/x"]
