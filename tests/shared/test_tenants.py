"""A tenant's limits, as the submit script checks them, and its counters, as the scripts that move a job
keep them: driven through the job store on the real Redis, with jobs started, finished, cancelled and
handed back as a worker would (no engine: the usage a worker records is written as it writes it)."""

from __future__ import annotations

import asyncio
from datetime import datetime, timedelta, timezone

import pytest

from shared.errors import RateLimited
from shared.events import CancelledEvent, DeltaEvent, DoneEvent, ErrorEvent, JobState, Usage, event_adapter
from shared.jobstore import JobStore, Outcome
from shared.lifecycle.transitions import Failure, JobStep, ReleaseOutcome
from shared.requests import JobRequest
from shared.tenants import Tenant, TenantUsage
from tests.shared.transitions import MODEL, WORKER, claimed, release, transitions

REQUEST = JobRequest(prompt="The capital of France is", max_tokens=8)
LEASE_SECONDS = 6.0


async def submit(store: JobStore, tenant: Tenant, request: JobRequest = REQUEST) -> str:
    return (await store.submit(request, owner="owner-1", model=MODEL, max_queued=0, tenant=tenant)).job_id


async def refusal(store: JobStore, tenant: Tenant) -> RateLimited:
    """The refusal of one more job, once nothing of it was written."""
    before = await store.redis.zcard(store.keys.model(MODEL).queue)
    with pytest.raises(RateLimited) as caught:
        await submit(store, tenant)
    assert await store.redis.zcard(store.keys.model(MODEL).queue) == before
    return caught.value


async def start(store: JobStore, job_id: str) -> None:
    assert await store.start(job_id, WORKER, MODEL, lease_seconds=LEASE_SECONDS) is not None


async def finish(store: JobStore, job_id: str, prompt_tokens: int, completion_tokens: int) -> None:
    usage = Usage(prompt_tokens=prompt_tokens, completion_tokens=completion_tokens)
    outcome = Outcome(JobState.completed, "text", completion_tokens, usage, finish_reason="length")
    done = DoneEvent(seq=2, finish_reason="length", usage=usage)
    await store.redis.execute_command(*store.finish_commands(job_id, WORKER, [done], outcome).record)


async def usage(store: JobStore, tenant: Tenant) -> TenantUsage:
    return await store.tenant_usage(tenant.name)


async def test_max_queued_jobs_refuses_at_the_limit_and_frees_as_jobs_start(store: JobStore) -> None:
    tenant = Tenant("team-a", max_queued_jobs=3)
    jobs = [await submit(store, tenant) for _ in range(3)]  # not before the limit
    refused = await refusal(store, tenant)
    assert refused.detail == {"limit": "max_queued_jobs"} and refused.retry_after == 1
    assert refused.message.startswith("max_queued_jobs: the tenant is at 3 of 3")
    await start(store, jobs[0])
    assert (await usage(store, tenant)).model_dump(include={"queued_jobs", "running_jobs"}) == {
        "queued_jobs": 2,
        "running_jobs": 1,
    }
    await submit(store, tenant)  # the started job left the queue
    await refusal(store, tenant)
    await store.cancel(jobs[1])  # a cancelled queued job leaves it too
    await submit(store, tenant)


async def test_another_tenant_and_a_job_without_one_are_not_held_by_a_tenants_limit(store: JobStore) -> None:
    full = Tenant("team-a", max_queued_jobs=1)
    await submit(store, full)
    await refusal(store, full)
    await submit(store, Tenant("team-b", max_queued_jobs=1))
    await store.submit(REQUEST, model=MODEL, max_queued=0)


async def test_max_running_jobs_counts_queued_and_running_and_frees_as_they_end(store: JobStore) -> None:
    tenant = Tenant("team-a", max_running_jobs=2)
    first, second = await submit(store, tenant), await submit(store, tenant)
    assert (await refusal(store, tenant)).detail == {"limit": "max_running_jobs"}
    await start(store, first)
    await start(store, second)
    await refusal(store, tenant)  # running now, still counted
    await finish(store, first, 3, 5)
    third = await submit(store, tenant)
    await refusal(store, tenant)
    await start(store, third)
    await store.redis.hset(store.keys.job(third), "attempts", "3")  # type: ignore[misc]
    released = await fail_out_of_attempts(
        store, third, Failure(ErrorEvent(seq=2, message="gone", code="worker_lost"), {}, "")
    )
    assert released is ReleaseOutcome.failed  # a job that fails out of attempts ends its run too
    assert (await usage(store, tenant)).running_jobs == 1
    await submit(store, tenant)


async def fail_out_of_attempts(store: JobStore, job_id: str, failure: Failure) -> ReleaseOutcome:
    """The job out of attempts fails: first without its output, then with the stream's tip."""
    assert await release(store, job_id, attempt=3) is ReleaseOutcome.exhausted
    tip = (await store.redis.xrevrange(store.keys.stream(job_id), count=1))[0][0]
    return await release(store, job_id, attempt=3, failure=Failure(failure.event, failure.fields, tip))


async def counts(store: JobStore, tenant: Tenant) -> dict[str, int]:
    return (await usage(store, tenant)).model_dump(include={"queued_jobs", "running_jobs"})


async def test_a_job_handed_back_counts_as_queued_until_it_runs_again(store: JobStore) -> None:
    tenant = Tenant("team-a", max_running_jobs=5)
    job_id = await submit(store, tenant)
    await start(store, job_id)
    assert await release(store, job_id, attempt=1) is ReleaseOutcome.requeued
    assert await counts(store, tenant) == {"queued_jobs": 1, "running_jobs": 0}  # it waits for a worker
    await start(store, job_id)  # resumed by another run
    assert await counts(store, tenant) == {"queued_jobs": 0, "running_jobs": 1}
    await finish(store, job_id, 1, 1)
    assert await counts(store, tenant) == {"queued_jobs": 0, "running_jobs": 0}


async def test_cancelling_a_job_handed_back_ends_it_at_once_and_frees_its_slot(store: JobStore) -> None:
    tenant = Tenant("team-a", max_running_jobs=1)
    job_id = await submit(store, tenant)
    assert await claimed(store) == [job_id]
    await start(store, job_id)
    step = [DeltaEvent(seq=2, text=" Paris", token_ids=[7, 8])]
    await transitions(store, maxlen=1000).step(worker_id=WORKER, step=JobStep(job_id, step))
    assert await release(store, job_id, attempt=1) is ReleaseOutcome.requeued  # the worker is stopping
    await refusal(store, tenant)

    answer, took_effect = await store.cancel(job_id)
    assert (answer.status, took_effect) == (JobState.cancelled, True)  # no worker to wait for
    record = await store.record(job_id)
    assert (record.status, record.output.text, record.output.token_count) == (JobState.cancelled, " Paris", 2)
    entries = await store.redis.xrange(store.keys.stream(job_id))
    last = event_adapter.validate_json(entries[-1][1]["data"])
    assert last == CancelledEvent(seq=3, usage=Usage(prompt_tokens=0, completion_tokens=2))
    assert await counts(store, tenant) == {"queued_jobs": 0, "running_jobs": 0}
    assert await store.redis.zcard(store.keys.model(MODEL).queue) == 0  # no worker will take it up
    assert await store.start(job_id, WORKER, MODEL, lease_seconds=LEASE_SECONDS) is None
    await submit(store, tenant)  # its slot is free


async def test_cancelling_a_running_job_whose_worker_is_gone_ends_it_at_once(store: JobStore) -> None:
    tenant = Tenant("team-a", max_running_jobs=1)
    job_id = await submit(store, tenant)
    await start(store, job_id)
    await store.redis.delete(store.keys.lease(job_id))  # its lease lapsed, and no reaper came yet
    answer, _ = await store.cancel(job_id)
    assert answer.status is JobState.cancelled
    assert not await store.redis.sismember(store.keys.running, job_id)  # nothing left for the reapers
    await submit(store, tenant)


async def test_a_held_running_job_is_only_asked_to_stop(store: JobStore) -> None:
    tenant = Tenant("team-a", max_running_jobs=1)
    job_id = await submit(store, tenant)
    await start(store, job_id)
    answer, _ = await store.cancel(job_id)
    assert answer.status is JobState.running  # its worker's next step ends it
    assert await store.redis.exists(store.keys.cancel(job_id))
    await refusal(store, tenant)


async def test_a_running_job_whose_record_expired_stops_counting(store: JobStore) -> None:
    tenant = Tenant("team-a", max_running_jobs=1)
    job_id = await submit(store, tenant)
    await start(store, job_id)
    await refusal(store, tenant)
    # No worker held it for the job's lifetime: its keys expired with its id still in the running set.
    await store.redis.pexpire(store.keys.job(job_id), 1)
    await asyncio.sleep(0.05)
    assert await store.redis.sismember(store.keys.tenant_running(tenant.name), job_id)
    assert await counts(store, tenant) == {"queued_jobs": 0, "running_jobs": 0}
    await submit(store, tenant)


async def test_admission_drops_a_running_id_whose_record_expired(store: JobStore) -> None:
    tenant = Tenant("team-a", max_running_jobs=1)
    job_id = await submit(store, tenant)
    await start(store, job_id)
    await store.redis.delete(store.keys.job(job_id))  # expired
    await submit(store, tenant)  # counted from the records: not one a usage read pruned first
    assert not await store.redis.sismember(store.keys.tenant_running(tenant.name), job_id)


async def test_a_job_past_its_deadline_leaves_its_tenants_queue_without_running(store: JobStore) -> None:
    tenant = Tenant("team-a", max_queued_jobs=1)
    job_id = await submit(
        store,
        tenant,
        REQUEST.model_copy(update={"deadline": datetime.now(timezone.utc) + timedelta(seconds=0.05)}),
    )
    await asyncio.sleep(0.1)
    assert await store.start(job_id, WORKER, MODEL, lease_seconds=LEASE_SECONDS) is None
    assert (await usage(store, tenant)).model_dump(include={"queued_jobs", "running_jobs"}) == {
        "queued_jobs": 0,
        "running_jobs": 0,
    }
    await submit(store, tenant)


async def test_requests_per_minute_counts_admitted_jobs_over_a_sliding_minute(store: JobStore) -> None:
    tenant = Tenant("team-a", requests_per_minute=4)
    jobs = [await submit(store, tenant) for _ in range(4)]
    for job_id in jobs:  # ended jobs were still requested this minute
        await store.cancel(job_id)
    refused = await refusal(store, tenant)
    assert refused.detail == {"limit": "requests_per_minute"}
    assert 55 <= refused.retry_after <= 60  # the first request leaves the window a minute after it came
    # a minute on, by Redis's clock: the window's entries are moved back in time instead of waiting
    requests = store.keys.tenant_requests(tenant.name)
    await store.redis.zadd(requests, {job_id: 1 for job_id in jobs[:2]}, xx=True)
    await submit(store, tenant)
    await submit(store, tenant)
    await refusal(store, tenant)
    assert (await usage(store, tenant)).requests_last_minute == 4


async def test_tokens_per_minute_counts_prompt_and_generated_tokens_of_ended_jobs(store: JobStore) -> None:
    tenant = Tenant("team-a", tokens_per_minute=100)
    first, second = await submit(store, tenant), await submit(store, tenant)
    await start(store, first)
    await finish(store, first, 30, 39)
    assert (await usage(store, tenant)).tokens_last_minute == 69
    await submit(store, tenant)  # 69 of 100: not before the limit
    await start(store, second)
    await finish(store, second, 30, 1)  # 100 of 100
    refused = await refusal(store, tenant)
    assert refused.detail == {"limit": "tokens_per_minute"}
    assert refused.message.startswith("tokens_per_minute: the tenant is at 100 of 100")
    # under the limit once the first job's 69 tokens leave the window: a minute after it ended
    assert 55 <= refused.retry_after <= 60
    counted = await usage(store, tenant)
    assert (counted.tokens_total, counted.jobs_ended_total) == (100, 2)


async def test_50_concurrent_submissions_admit_exactly_the_limit(store: JobStore) -> None:
    tenant = Tenant("team-a", max_queued_jobs=7, requests_per_minute=1000)
    outcomes = await asyncio.gather(*(submit(store, tenant) for _ in range(50)), return_exceptions=True)
    admitted = [outcome for outcome in outcomes if isinstance(outcome, str)]
    refused = [outcome for outcome in outcomes if isinstance(outcome, RateLimited)]
    assert (len(admitted), len(refused)) == (7, 43)
    assert await store.redis.zcard(store.keys.model(MODEL).queue) == 7
    assert (await usage(store, tenant)).model_dump(include={"queued_jobs", "requests_last_minute"}) == {
        "queued_jobs": 7,
        "requests_last_minute": 7,  # refused requests are not counted
    }


async def test_an_idempotent_replay_is_not_counted_again(store: JobStore) -> None:
    tenant = Tenant("team-a", max_queued_jobs=1, requests_per_minute=1)

    async def again() -> str:
        return (
            await store.submit(
                REQUEST, owner="owner-1", model=MODEL, max_queued=0, tenant=tenant, idempotency_key="once"
            )
        ).job_id

    assert await again() == await again()
    await refusal(store, tenant)
