"""Webhooks end to end but for the engine: jobs submitted through an in-process gateway, ended
through the lifecycle as a worker ends them, and delivered by the gateway's sender to a real
receiver on loopback, which checks every signature with the Standard Webhooks library."""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
import redis.asyncio as aioredis
from openai.types.webhooks import ResponseIncompleteWebhookEvent

from gateway.auth import owner_id
from gateway.webhooks.deliveries import GROUP
from gateway.webhooks.sender import TOO_MANY
from shared.config import Settings
from shared.events import DoneEvent, JobState, Usage
from shared.jobstore import JobStore, Outcome
from shared.keys import Keys
from shared.requests import JobRequest
from shared.webhooks import API, RESPONSE_API, WEBHOOK_URL
from tests.conftest import delete_test_keys, make_settings
from tests.gateway.keyed_gateway import KEY_A, KEY_B, bearer
from tests.gateway.webhooks.receiver import Receiver, new_secret, receiving
from tests.helpers import eventually, in_process_gateway

SECRET_A, SECRET_B = new_secret(), new_secret()
KEY_C = "key-c-without-a-secret"
WORKER = "worker-1"
PROMPT = {"prompt": "The capital of France is", "max_tokens": 8}


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    """KEY_A's receiver; it fails the first two deliveries."""
    with receiving(SECRET_A, failures=2) as receiver:
        yield receiver


@pytest.fixture
def receiver_b() -> Iterator[Receiver]:
    """KEY_B's default webhook."""
    with receiving(SECRET_B) as receiver:
        yield receiver


@pytest.fixture
async def settings(
    redis_url: str, redis_client: aioredis.Redis, tmp_path: Path, receiver: Receiver, receiver_b: Receiver
) -> AsyncIterator[Settings]:
    keys_file = tmp_path / "keys.toml"
    keys_file.write_text(
        f'[[keys]]\nkey = "{KEY_A}"\nwebhook_secret = "{SECRET_A}"\n\n'
        f'[[keys]]\nkey = "{KEY_B}"\nwebhook_secret = "{SECRET_B}"\nwebhook_url = "{receiver_b.url}"\n\n'
        f'[[keys]]\nkey = "{KEY_C}"\n'
    )
    settings = make_settings(
        redis_url,
        api_keys_file=keys_file,
        webhook_allowed_prefixes=[receiver.url, receiver_b.url],
        webhook_first_retry_seconds=0.05,
        webhook_max_retry_gap_seconds=0.2,
        webhook_takeover_seconds=0.5,
    )
    yield settings
    await delete_test_keys(redis_client, Keys.of(settings))


@pytest.fixture
def store(settings: Settings, redis_client: aioredis.Redis) -> JobStore:
    return JobStore(redis_client, Keys.of(settings), settings)


async def complete(store: JobStore, job_id: str, finish_reason: str = "stop") -> None:
    """Run the job to its end as a worker does: start it, then finish it with its last event."""
    assert await store.start(job_id, WORKER, "smol", lease_seconds=60) is not None
    usage = Usage(prompt_tokens=5, completion_tokens=8)
    outcome = Outcome(JobState.completed, "Paris.", 8, usage, finish_reason=finish_reason)
    done = DoneEvent(seq=2, finish_reason=finish_reason, usage=usage)
    await store.redis.execute_command(*store.finish_commands(job_id, WORKER, [done], outcome).record)


async def submit(gateway: httpx.AsyncClient, key: str, **body: Any) -> httpx.Response:
    return await gateway.post("/v1/jobs", json={**PROMPT, **body}, headers=bearer(key))


async def delivered_record(gateway: httpx.AsyncClient, job_id: str, key: str) -> dict[str, Any]:
    async def record() -> dict[str, Any]:
        answer = await gateway.get(f"/v1/jobs/{job_id}/webhook", headers=bearer(key))
        assert answer.status_code == 200, answer.text
        body: dict[str, Any] = answer.json()
        return body

    return await eventually(record, "the webhook delivered", until=lambda body: body["status"] == "delivered")


async def test_a_webhook_that_fails_at_first_is_retried_then_delivered_once_signed(
    settings: Settings, store: JobStore, receiver: Receiver
) -> None:
    async with in_process_gateway(settings) as gateway:
        answer = await submit(gateway, KEY_A, webhook=receiver.url)
        assert answer.status_code == 202, answer.text
        job_id = answer.json()["id"]
        pending = (await gateway.get(f"/v1/jobs/{job_id}/webhook", headers=bearer(KEY_A))).json()
        assert pending == {"url": receiver.url, "status": None, "attempts": 0} | {
            name: None for name in pending if name not in ("url", "status", "attempts")
        }
        before = int(time.time())
        await complete(store, job_id)
        record = await delivered_record(gateway, job_id, KEY_A)

    got = receiver.got()
    assert [delivery.status for delivery in got] == [503, 503, 204]  # every signature held
    assert {delivery.headers["webhook-id"] for delivery in got} == {f"evt_{job_id}"}
    assert {delivery.body for delivery in got} == {got[0].body}
    event = got[0].event
    assert event == {
        "id": f"evt_{job_id}",
        "object": "event",
        "type": "job.completed",
        "created_at": event["created_at"],
        "data": {"id": job_id},
    }
    assert before <= event["created_at"] <= time.time()
    assert record["event"] == "job.completed" and record["event_id"] == f"evt_{job_id}"
    assert record["attempts"] == 3 and record["last_status"] == 204 and record["last_error"] is None
    assert record["delivered_at"] is not None and record["next_attempt_at"] is None
    # Delivered, its entry left the stream with the record's change: no sender can send it again.
    assert await store.redis.xlen(store.keys.webhooks) == 0
    assert (await store.redis.xpending(store.keys.webhooks, GROUP))["pending"] == 0


async def test_a_cancelled_queued_job_goes_to_its_keys_default_webhook(
    settings: Settings, receiver_b: Receiver
) -> None:
    async with in_process_gateway(settings) as gateway:
        answer = await submit(gateway, KEY_B)
        job_id = answer.json()["id"]
        assert (await gateway.post(f"/v1/jobs/{job_id}/cancel", headers=bearer(KEY_B))).status_code == 202
        record = await delivered_record(gateway, job_id, KEY_B)
    assert record["event"] == "job.cancelled" and record["attempts"] == 1
    [delivery] = receiver_b.got()
    assert delivery.status == 204
    assert delivery.event["type"] == "job.cancelled" and delivery.event["data"] == {"id": job_id}


async def test_the_delivery_record_is_its_owners_alone(settings: Settings, receiver: Receiver) -> None:
    async with in_process_gateway(settings) as gateway:
        with_webhook = (await submit(gateway, KEY_A, webhook=receiver.url)).json()["id"]
        without = (await submit(gateway, KEY_C)).json()["id"]
        foreign = await gateway.get(f"/v1/jobs/{with_webhook}/webhook", headers=bearer(KEY_B))
        none = await gateway.get(f"/v1/jobs/{without}/webhook", headers=bearer(KEY_C))
    assert foreign.status_code == 404 and foreign.json()["error_type"] == "not_found"
    assert none.status_code == 404 and "no webhook" in none.json()["error"]


@pytest.mark.parametrize(
    ("key", "webhook", "reason"),
    [
        (KEY_A, "http://127.0.0.1:9/elsewhere/", "webhook_allowed_prefixes"),
        (KEY_A, "ftp://127.0.0.1/hooks/", "http or https"),
        (KEY_A, "http://user:pw@127.0.0.1/hooks/", "credentials"),
        (KEY_C, None, "webhook_secret"),  # in the allowed prefix, but the key cannot sign
    ],
    ids=["outside-the-prefixes", "not-http", "credentials", "key-without-a-secret"],
)
async def test_a_webhook_that_is_not_allowed_is_400_and_writes_nothing(
    settings: Settings,
    receiver: Receiver,
    redis_client: aioredis.Redis,
    key: str,
    webhook: str | None,
    reason: str,
) -> None:
    async with in_process_gateway(settings) as gateway:
        answer = await submit(gateway, key, webhook=webhook or receiver.url)
    assert answer.status_code == 400, answer.text
    assert answer.json()["error_type"] == "webhook_refused"
    assert answer.json()["error"].startswith("webhook: ") and reason in answer.json()["error"]
    assert [name async for name in redis_client.scan_iter(match=f"{settings.key_prefix}:*")] == []


async def test_the_webhook_is_no_part_of_the_idempotent_request(
    settings: Settings, receiver: Receiver
) -> None:
    async with in_process_gateway(settings) as gateway:
        key = {"Idempotency-Key": "order-7", **bearer(KEY_A)}
        first = await gateway.post("/v1/jobs", json={**PROMPT, "webhook": receiver.url}, headers=key)
        again = await gateway.post("/v1/jobs", json=PROMPT, headers=key)
    assert again.status_code == 202 and again.json()["id"] == first.json()["id"]


async def test_a_gateway_no_webhook_went_through_stops_quietly_and_leaves_no_key(
    settings: Settings, redis_client: aioredis.Redis, caplog: pytest.LogCaptureFixture
) -> None:
    """Its sender never found the webhooks stream, so it never made the consumer group: leaving it at
    shutdown is nothing to do, not a Redis error to warn an operator of."""
    async with in_process_gateway(settings) as gateway:
        assert (await gateway.get("/health")).status_code == 200
    assert not [record for record in caplog.records if record.levelno >= logging.WARNING], caplog.text
    assert await redis_client.exists(Keys.of(settings).webhooks) == 0


async def test_a_gone_gateways_delivery_is_taken_over(
    settings: Settings, store: JobStore, receiver: Receiver
) -> None:
    """The job ends and a sender takes its announcement before any gateway here runs; that sender is
    gone (it never acknowledges): the gateway started afterwards takes the entry over and delivers it."""
    receiver.failures = 0
    annotations = {WEBHOOK_URL: receiver.url, API: "job"}
    job_id = (
        await store.submit(
            JobRequest(**PROMPT), owner=owner_id(KEY_A), model="smol", max_queued=0, annotations=annotations
        )
    ).job_id
    await complete(store, job_id)
    await store.redis.xgroup_create(store.keys.webhooks, GROUP, id="0")
    assert await store.redis.xreadgroup(GROUP, "gone-gateway", {store.keys.webhooks: ">"})
    async with in_process_gateway(settings) as gateway:
        record = await delivered_record(gateway, job_id, KEY_A)
    assert record["attempts"] == 1
    assert [delivery.event["data"]["id"] for delivery in receiver.accepted()] == [job_id]


async def test_a_response_cut_by_its_token_limit_is_announced_as_openai_names_it(
    settings: Settings, store: JobStore, receiver: Receiver
) -> None:
    """A job the Responses API made (annotated `api: response`) is announced with OpenAI's event, which
    the `openai` package's own webhook check accepts and parses."""
    receiver.failures = 0
    annotations = {WEBHOOK_URL: receiver.url, API: RESPONSE_API}
    async with in_process_gateway(settings) as gateway:
        job_id = (
            await store.submit(
                JobRequest(**PROMPT),
                owner=owner_id(KEY_A),
                model="smol",
                max_queued=0,
                annotations=annotations,
            )
        ).job_id
        await complete(store, job_id, finish_reason="length")
        await delivered_record(gateway, job_id, KEY_A)
    [delivery] = receiver.accepted()
    client = openai.OpenAI(api_key="unused", webhook_secret=SECRET_A)
    event = client.webhooks.unwrap(delivery.body, delivery.headers)
    assert isinstance(event, ResponseIncompleteWebhookEvent)
    assert event.data.id == f"resp_{job_id}" and event.id == f"evt_{job_id}"


async def test_past_max_pending_the_oldest_deliveries_are_given_up_and_say_so(
    settings: Settings, store: JobStore, receiver: Receiver
) -> None:
    """A receiver that never answers 2xx, and more ended jobs of one tenant than its
    `webhook_max_pending_per_tenant`: the stream keeps that many, and the oldest deliveries are `failed`
    with the reason, their records still expiring."""
    receiver.failures = 10**6
    bounded = settings.model_copy(update={"webhook_max_pending_per_tenant": 3})
    async with in_process_gateway(bounded) as gateway:
        job_ids = [(await submit(gateway, KEY_A, webhook=receiver.url)).json()["id"] for _ in range(8)]
        for job_id in job_ids:
            assert (await gateway.post(f"/v1/jobs/{job_id}/cancel", headers=bearer(KEY_A))).status_code == 202

        async def records() -> list[dict[str, Any]]:
            answers = [
                await gateway.get(f"/v1/jobs/{job_id}/webhook", headers=bearer(KEY_A)) for job_id in job_ids
            ]
            return [answer.json() for answer in answers]

        given_up = await eventually(
            records,
            "the oldest deliveries given up",
            until=lambda bodies: [body["status"] for body in bodies] == ["failed"] * 5 + ["pending"] * 3,
        )
        assert await store.redis.xlen(store.keys.webhooks) == 3
    assert {body["last_error"] for body in given_up[:5]} == {TOO_MANY}
    for job_id in job_ids:
        assert await store.redis.ttl(store.keys.webhook(job_id)) > 0
