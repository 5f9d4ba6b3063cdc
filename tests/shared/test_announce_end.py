"""Every transition that ends a job announces the end of a job with a webhook in the same step, once:
an entry on the webhooks stream and the job's delivery record, each holding all a sender needs."""

from __future__ import annotations

import time
from datetime import datetime, timezone

from shared.events import DoneEvent, ErrorEvent, JobState, Usage
from shared.jobstore import JobStore, Outcome
from shared.lifecycle.transitions import Failure, ReleaseOutcome
from shared.requests import JobRequest
from shared.webhooks import API, RESPONSE_API, WEBHOOK_URL
from tests.shared.test_lifecycle import LEASE_SECONDS, REQUEST
from tests.shared.transitions import WORKER, release

URL = "http://127.0.0.1:9/hooks/"


async def submitted(store: JobStore, request: JobRequest = REQUEST, **annotations: str) -> str:
    annotations = annotations or {WEBHOOK_URL: URL, API: "job"}
    return (
        await store.submit(request, owner="owner-1", model="smol", max_queued=0, annotations=annotations)
    ).job_id


async def announced(store: JobStore) -> list[dict[str, str]]:
    return [fields for _, fields in await store.redis.xrange(store.keys.webhooks)]


async def finish(store: JobStore, job_id: str, finish_reason: str) -> None:
    usage = Usage(prompt_tokens=3, completion_tokens=8)
    outcome = Outcome(JobState.completed, "text", 8, usage, finish_reason=finish_reason)
    done = DoneEvent(seq=2, finish_reason=finish_reason, usage=usage)
    await store.redis.execute_command(*store.finish_commands(job_id, WORKER, [done], outcome).record)


async def test_a_completed_job_is_announced_once_with_all_a_sender_needs(store: JobStore) -> None:
    job_id = await submitted(store, **{WEBHOOK_URL: URL, API: RESPONSE_API})
    assert await store.start(job_id, WORKER, "smol", lease_seconds=LEASE_SECONDS) is not None
    assert await announced(store) == []  # nothing until it ends
    await finish(store, job_id, "length")
    await finish(store, job_id, "length")  # no longer running: changes nothing
    [entry] = await announced(store)
    ended_at = await store.redis.hget(store.keys.job(job_id), "finished_at")  # type: ignore[misc]
    assert entry == {
        "job": job_id,
        "url": URL,
        "api": RESPONSE_API,
        "owner": "owner-1",
        "state": "completed",
        "finish_reason": "length",
        "ended_at": ended_at,
    }
    record = await store.redis.hgetall(store.keys.webhook(job_id))  # type: ignore[misc]
    assert record == entry | {"status": "pending", "attempts": "0"}
    assert 0 < await store.redis.ttl(store.keys.webhook(job_id)) <= store.settings.retention_seconds


async def test_a_cancelled_queued_job_is_announced(store: JobStore) -> None:
    job_id = await submitted(store)
    await store.cancel(job_id)
    await store.cancel(job_id)
    assert [entry["state"] for entry in await announced(store)] == ["cancelled"]


async def test_a_job_failed_out_of_attempts_is_announced(store: JobStore) -> None:
    job_id = await submitted(store)
    assert await store.start(job_id, WORKER, "smol", lease_seconds=LEASE_SECONDS) is not None
    await store.redis.hset(store.keys.job(job_id), "attempts", "3")  # type: ignore[misc]
    now = time.time()
    assert await release(store, job_id, attempt=3, now=now) is ReleaseOutcome.exhausted
    assert await announced(store) == []  # not failed yet: its output is still to be read
    tip = (await store.redis.xrange(store.keys.stream(job_id)))[-1][0]
    failure = Failure(ErrorEvent(seq=2, message="gone", code="worker_lost"), {}, tip)
    assert await release(store, job_id, attempt=3, failure=failure, now=now) is ReleaseOutcome.failed
    assert [entry["state"] for entry in await announced(store)] == ["failed"]


async def test_a_job_past_its_deadline_is_announced_failed(store: JobStore) -> None:
    past = JobRequest(prompt="hi", deadline=datetime(2020, 1, 1, tzinfo=timezone.utc))
    job_id = await submitted(store, past)
    assert await store.start(job_id, WORKER, "smol", lease_seconds=LEASE_SECONDS) is None
    assert [entry["state"] for entry in await announced(store)] == ["failed"]


async def test_a_job_without_a_webhook_is_not_announced(store: JobStore) -> None:
    queued = (await store.submit(REQUEST, model="smol", max_queued=0)).job_id
    await store.cancel(queued)
    running = (await store.submit(REQUEST, model="smol", max_queued=0)).job_id
    assert await store.start(running, WORKER, "smol", lease_seconds=LEASE_SECONDS) is not None
    await finish(store, running, "stop")
    assert not await store.redis.exists(
        store.keys.webhooks, store.keys.webhook(queued), store.keys.webhook(running)
    )
