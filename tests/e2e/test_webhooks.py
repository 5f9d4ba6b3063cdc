"""A real job on the real engine announces its end to its webhook: the session's workers run it, and
a gateway with keys and an allowed prefix (in this process, on the session's Redis and prefix)
delivers the signed event to a receiver on loopback once the job has completed; a background
response of the Responses API, made with the `openai` package, announces `response.*` events."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
from openai import AsyncOpenAI

from tests.conftest import System
from tests.gateway.keyed_gateway import KEY_A, bearer
from tests.gateway.webhooks.receiver import Receiver, new_secret, receiving
from tests.helpers import JOB_DEADLINE_SECONDS, eventually, in_process_gateway


@asynccontextmanager
async def keyed_gateway(
    system: System, tmp_path: Path, failures: int
) -> AsyncIterator[tuple[httpx.AsyncClient, Receiver]]:
    """A gateway in this process whose key KEY_A signs webhooks, and a receiver that fails `failures`
    times first. The session's own gateway has no key for the jobs: it leaves their deliveries to
    this one, whose short takeover time takes them over should that gateway have read one first."""
    secret = new_secret()
    keys_file = tmp_path / "keys.toml"
    keys_file.write_text(f'[[keys]]\nkey = "{KEY_A}"\nwebhook_secret = "{secret}"\n')
    with receiving(secret, failures=failures) as receiver:
        settings = system.settings.model_copy(
            update={
                "allow_unauthenticated": False,
                "api_keys_file": keys_file,
                "webhook_allowed_prefixes": [receiver.url],
                "webhook_first_retry_seconds": 0.1,
                "webhook_takeover_seconds": 1.0,
            }
        )
        async with in_process_gateway(settings) as gateway:
            yield gateway, receiver


async def delivered(gateway: httpx.AsyncClient, job_id: str) -> dict[str, Any]:
    """The job's delivery record, once it says `delivered`."""

    async def delivery() -> dict[str, Any]:
        record: dict[str, Any] = (
            await gateway.get(f"/v1/jobs/{job_id}/webhook", headers=bearer(KEY_A))
        ).json()
        return record

    return await eventually(
        delivery, "the webhook delivered", JOB_DEADLINE_SECONDS, until=lambda r: r["status"] == "delivered"
    )


async def test_a_job_run_by_a_worker_is_delivered_to_its_webhook(system: System, tmp_path: Path) -> None:
    async with keyed_gateway(system, tmp_path, failures=1) as (gateway, receiver):
        body = {"prompt": "The capital of France is", "max_tokens": 8, "temperature": 0}
        answer = await gateway.post("/v1/jobs", json={**body, "webhook": receiver.url}, headers=bearer(KEY_A))
        assert answer.status_code == 202, answer.text
        job_id = answer.json()["id"]

        record = await delivered(gateway, job_id)
        job = (await gateway.get(f"/v1/jobs/{job_id}", headers=bearer(KEY_A))).json()
    assert job["status"] == "completed" and job["output"]["text"]
    assert record["event"] == "job.completed" and record["attempts"] == 2
    assert [(delivery.status, delivery.event["type"]) for delivery in receiver.got()] == [
        (503, "job.completed"),
        (204, "job.completed"),
    ]
    assert receiver.got()[0].event["data"] == {"id": job_id}


async def test_a_background_response_announces_its_end_as_a_response_event(
    system: System, tmp_path: Path
) -> None:
    async with keyed_gateway(system, tmp_path, failures=0) as (gateway, receiver):
        client = AsyncOpenAI(base_url="http://gateway/v1", api_key=KEY_A, http_client=gateway)
        response = await client.responses.create(
            model=system.settings.model_name,
            input="Count from one to ten:",
            max_output_tokens=4,
            temperature=0,
            background=True,
            extra_body={"webhook": receiver.url},
        )
        job_id = response.id.removeprefix("resp_")
        record = await delivered(gateway, job_id)
        final = await client.responses.retrieve(response.id)
    # max_output_tokens cut it: OpenAI's `incomplete`, announced as such.
    assert (final.status, final.incomplete_details and final.incomplete_details.reason) == (
        "incomplete",
        "max_output_tokens",
    )
    assert record["event"] == "response.incomplete" and record["attempts"] == 1
    [got] = receiver.got()
    assert (got.status, got.event["type"], got.event["data"]) == (
        204,
        "response.incomplete",
        {"id": response.id},
    )
