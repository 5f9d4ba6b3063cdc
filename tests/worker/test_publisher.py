"""The publisher against the real Redis: batched steps, cancel checks, ordered events, terminal writes."""

from __future__ import annotations

import asyncio
import uuid

import pytest

from shared.events import DeltaEvent, DoneEvent, ErrorEvent, Event, JobState, Usage, event_adapter
from shared.jobstore import JobStore, Outcome
from shared.requests import JobRequest
from tests.conftest import UNIT_RETENTION_SECONDS
from worker.publisher import Publisher

USAGE = Usage(prompt_tokens=5, completion_tokens=2)
COMPLETED = Outcome(JobState.completed, "ab", 2, USAGE, finish_reason="stop")


@pytest.fixture
def publisher(store: JobStore) -> Publisher:
    return Publisher(store.redis, store)


def delta(seq: int, text: str = "a", token_id: int = 1) -> DeltaEvent:
    return DeltaEvent(seq=seq, text=text, token_ids=[token_id])


async def started_job(store: JobStore) -> str:
    job_id = (await store.submit(JobRequest(prompt="hi", max_tokens=2))).job_id
    assert await store.start(job_id, "worker-1", "smol") is not None
    return job_id


async def stream_events(store: JobStore, job_id: str) -> list[Event]:
    entries = await store.redis.xrange(store.keys.stream(job_id))
    assert all(set(fields) == {"type", "data"} for _, fields in entries)
    events = [event_adapter.validate_json(fields["data"]) for _, fields in entries]
    assert [event.type for event in events] == [fields["type"] for _, fields in entries]
    return events


async def test_concurrent_steps_of_many_jobs_share_a_round_trip(
    store: JobStore, publisher: Publisher
) -> None:
    job_ids = [uuid.uuid4().hex for _ in range(50)]
    cancelled = await asyncio.gather(*(publisher.step(job_id, [delta(2)]) for job_id in job_ids))
    assert cancelled == [False] * 50
    assert publisher.round_trips <= 2
    for job_id in job_ids:
        assert await store.redis.xlen(store.keys.stream(job_id)) == 1


async def test_step_reports_cancel_once_the_cancel_key_is_set(store: JobStore, publisher: Publisher) -> None:
    job_id, other = uuid.uuid4().hex, uuid.uuid4().hex
    assert await publisher.step(job_id, [delta(2)]) is False
    await store.redis.set(store.keys.cancel(job_id), "1")
    answers = await asyncio.gather(publisher.step(job_id, [delta(3)]), publisher.step(other, [delta(2)]))
    assert answers == [True, False]


async def test_step_without_events_still_checks_cancel(store: JobStore, publisher: Publisher) -> None:
    job_id = uuid.uuid4().hex
    await store.redis.set(store.keys.cancel(job_id), "1")
    assert await publisher.step(job_id, []) is True
    assert await store.redis.xlen(store.keys.stream(job_id)) == 0


async def test_step_appends_events_in_order_with_type_and_data(store: JobStore, publisher: Publisher) -> None:
    job_id = uuid.uuid4().hex
    await publisher.step(job_id, [delta(2, "a", 10), delta(3, "b", 11), delta(4, "c", 12)])
    await publisher.step(job_id, [delta(5, "d", 13)])
    events = await stream_events(store, job_id)
    assert events == [delta(2, "a", 10), delta(3, "b", 11), delta(4, "c", 12), delta(5, "d", 13)]


async def test_finish_writes_terminal_event_last_and_ends_the_record(
    store: JobStore, publisher: Publisher
) -> None:
    job_id = await started_job(store)
    await publisher.step(job_id, [delta(2, "a")])
    done = DoneEvent(seq=4, finish_reason="stop", usage=USAGE)
    assert await publisher.finish(job_id, [delta(3, "b"), done], COMPLETED) == "completed"

    events = await stream_events(store, job_id)
    assert [event.type for event in events] == ["status", "status", "delta", "delta", "done"]
    assert events[-1] == done
    record = await store.record(job_id)
    assert (record.status, record.finish_reason, record.usage) == (JobState.completed, "stop", USAGE)
    assert (record.output.text, record.output.token_count) == ("ab", 2)
    assert record.finished_at is not None
    for name in (store.keys.job(job_id), store.keys.stream(job_id)):
        assert 0 < await store.redis.ttl(name) <= UNIT_RETENTION_SECONDS


async def test_finish_of_a_finished_job_keeps_its_first_terminal_state(
    store: JobStore, publisher: Publisher
) -> None:
    job_id = await started_job(store)
    await publisher.finish(job_id, [DoneEvent(seq=2, finish_reason="stop", usage=USAGE)], COMPLETED)
    failed = Outcome(JobState.failed, "", 0, USAGE, error="late failure")
    late_error = ErrorEvent(seq=3, message="late failure", code="internal")
    answer = await publisher.finish(job_id, [late_error], failed)
    assert answer == "completed"
    record = await store.record(job_id)
    assert (record.status, record.error) == (JobState.completed, None)
    assert [event.type for event in await stream_events(store, job_id)] == ["status", "status", "done"]


async def test_finish_of_a_cancelled_queued_job_writes_no_terminal_state(
    store: JobStore, publisher: Publisher
) -> None:
    job_id = (await store.submit(JobRequest(prompt="hi", max_tokens=2))).job_id
    await store.cancel(job_id)
    done = DoneEvent(seq=2, finish_reason="stop", usage=USAGE)
    assert await publisher.finish(job_id, [done], COMPLETED) == "cancelled"
    assert await store.status(job_id) is JobState.cancelled
    assert [event.type for event in await stream_events(store, job_id)] == ["status", "cancelled"]


async def test_refused_finish_appends_nothing_after_the_terminal_event(
    store: JobStore, publisher: Publisher
) -> None:
    job_id = await started_job(store)
    await publisher.finish(job_id, [DoneEvent(seq=2, finish_reason="stop", usage=USAGE)], COMPLETED)
    failed = Outcome(JobState.failed, "z", 1, USAGE, error="late")
    late_error = ErrorEvent(seq=4, message="late", code="internal")
    await publisher.finish(job_id, [delta(3, "z"), late_error], failed)
    assert [event.type for event in await stream_events(store, job_id)] == ["status", "status", "done"]
