"""The job store's state machine against the real Redis: submit, idempotency, limit, start, cancel, record."""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable

import pytest
import redis.asyncio as aioredis

from shared.errors import JobNotFound, Overloaded
from shared.events import DeltaEvent, DoneEvent, Event, FunctionDelta, JobState, ToolCallDelta, Usage
from shared.jobstore import JobStore, Outcome
from shared.keys import Keys
from shared.lifecycle.transitions import FinishOutcome, Verdict
from shared.requests import JobRequest
from tests.conftest import UNIT_RETENTION_SECONDS
from tests.helpers import arq_keys_of
from worker.publisher import Publisher

REQUEST = JobRequest(prompt="The capital of France is", max_tokens=8)
MODEL = "smol"
LEASE_SECONDS = 6.0


async def prefix_keys(client: aioredis.Redis, keys: Keys) -> set[str]:
    return {name async for name in client.scan_iter(match=f"{keys.prefix}:*", count=1000)}


@pytest.fixture
def small_store(store_factory: Callable[..., JobStore]) -> JobStore:
    """A store whose queue takes two jobs."""
    return store_factory(max_queued_jobs=2)


async def stream_types(store: JobStore, job_id: str) -> list[str]:
    return [fields["type"] for _, fields in await store.redis.xrange(store.keys.stream(job_id))]


async def test_submit_writes_record_queued_event_and_queue_entry_under_the_prefix(
    store: JobStore, redis_url: str
) -> None:
    submission = await store.submit(REQUEST, model=MODEL, max_queued=0)
    job_id, keys = submission.job_id, store.keys
    assert (submission.created, submission.status) == (True, JobState.queued)

    record = await store.redis.hgetall(keys.job(job_id))
    assert (record["id"], record["status"]) == (job_id, "queued")
    assert JobRequest.model_validate_json(record["request"]) == REQUEST

    [(_, entry)] = await store.redis.xrange(keys.stream(job_id))
    assert entry["type"] == "status"
    queued = {"type": "status", "seq": 0, "state": "queued", "message": None}
    assert json.loads(entry["data"]) == {**queued, "resumed": False, "attempt": None}

    assert await store.redis.zscore(keys.model(MODEL).queue, job_id) is not None
    for name in (keys.job(job_id), keys.stream(job_id)):
        assert await store.redis.ttl(name) > 0, name
    # arq's queue is the model's, under the prefix; arq keeps no payload or other key of its own.
    assert await arq_keys_of(store.redis, [job_id]) == []


async def test_annotations_are_written_with_the_job_and_read_back_apart_from_its_fields(
    store: JobStore, small_store: JobStore
) -> None:
    kept = {"status": "not the job's", "webhook": "https://example.test/hook"}
    job_id = (await store.submit(REQUEST, model=MODEL, max_queued=0, annotations=kept)).job_id
    assert await store.annotations(job_id) == kept
    assert (await store.record(job_id)).status is JobState.queued  # a field named alike changes nothing
    assert await store.annotations((await store.submit(REQUEST, model=MODEL, max_queued=0)).job_id) == {}
    with pytest.raises(JobNotFound):
        await store.annotations(uuid.uuid4().hex)
    # A refused submission writes no annotations either: nothing of the job exists.
    await small_store.submit(REQUEST, model=MODEL, max_queued=1)
    before = await prefix_keys(small_store.redis, small_store.keys)
    with pytest.raises(Overloaded):
        await small_store.submit(REQUEST, model=MODEL, max_queued=1, annotations=kept)
    assert await prefix_keys(small_store.redis, small_store.keys) == before


async def test_same_idempotency_key_returns_the_same_job(store: JobStore) -> None:
    first = await store.submit(REQUEST, model=MODEL, idempotency_key="order-42", max_queued=0)
    again = await store.submit(REQUEST, model=MODEL, idempotency_key="order-42", max_queued=0)
    other = await store.submit(REQUEST, model=MODEL, idempotency_key="order-43", max_queued=0)
    assert (again.job_id, again.created, again.created_at) == (first.job_id, False, first.created_at)
    assert first.created and other.created and other.job_id != first.job_id
    assert await store.redis.zcard(store.keys.model(MODEL).queue) == 2


async def test_submission_over_the_queue_limit_is_refused_and_writes_nothing(small_store: JobStore) -> None:
    await small_store.submit(REQUEST, model=MODEL, max_queued=2)
    await small_store.submit(REQUEST, model=MODEL, max_queued=2)
    before = await prefix_keys(small_store.redis, small_store.keys)
    with pytest.raises(Overloaded):
        await small_store.submit(REQUEST, model=MODEL, idempotency_key="late", max_queued=2)
    assert await prefix_keys(small_store.redis, small_store.keys) == before
    assert await small_store.redis.zcard(small_store.keys.model(MODEL).queue) == 2


async def test_idempotent_replay_is_answered_even_when_the_queue_is_full(small_store: JobStore) -> None:
    first = await small_store.submit(REQUEST, model=MODEL, idempotency_key="k", max_queued=2)
    await small_store.submit(REQUEST, model=MODEL, max_queued=2)
    again = await small_store.submit(REQUEST, model=MODEL, idempotency_key="k", max_queued=2)
    assert (again.job_id, again.created) == (first.job_id, False)


async def test_cancel_of_queued_job_removes_it_from_the_queue(store: JobStore) -> None:
    job_id = (await store.submit(REQUEST, model=MODEL, max_queued=0)).job_id
    answer, took_effect = await store.cancel(job_id)
    assert (answer.status, took_effect) == (JobState.cancelled, True)
    assert (await store.record(job_id)).status is JobState.cancelled
    assert await store.redis.zscore(store.keys.model(MODEL).queue, job_id) is None
    assert await stream_types(store, job_id) == ["status", "cancelled"]
    for name in (store.keys.job(job_id), store.keys.stream(job_id)):
        assert 0 < await store.redis.ttl(name) <= UNIT_RETENTION_SECONDS


async def test_second_cancel_changes_nothing_and_says_so(store: JobStore) -> None:
    job_id = (await store.submit(REQUEST, model=MODEL, max_queued=0)).job_id
    await store.cancel(job_id)
    answer, took_effect = await store.cancel(job_id)
    assert (answer.status, took_effect) == (JobState.cancelled, False)
    assert "nothing changed" in answer.message
    assert await stream_types(store, job_id) == ["status", "cancelled"]


async def test_start_moves_a_queued_job_to_running_and_returns_its_request(store: JobStore) -> None:
    job_id = (await store.submit(REQUEST, model=MODEL, max_queued=0)).job_id
    started = await store.start(job_id, "worker-1", MODEL, lease_seconds=LEASE_SECONDS)
    assert started is not None and (started.request, started.attempt) == (REQUEST, 1)
    record = await store.record(job_id)
    assert (record.status, record.worker, record.model) == (JobState.running, "worker-1", "smol")
    assert record.started_at is not None and record.queue_position is None
    assert await stream_types(store, job_id) == ["status", "status"]


async def test_start_of_running_job_returns_none(store: JobStore) -> None:
    job_id = (await store.submit(REQUEST, model=MODEL, max_queued=0)).job_id
    await store.start(job_id, "worker-1", MODEL, lease_seconds=LEASE_SECONDS)
    assert await store.start(job_id, "worker-2", MODEL, lease_seconds=LEASE_SECONDS) is None


async def test_start_of_cancelled_job_returns_none(store: JobStore) -> None:
    job_id = (await store.submit(REQUEST, model=MODEL, max_queued=0)).job_id
    await store.cancel(job_id)
    assert await store.start(job_id, "worker-1", MODEL, lease_seconds=LEASE_SECONDS) is None
    assert (await store.record(job_id)).status is JobState.cancelled
    assert await stream_types(store, job_id) == ["status", "cancelled"]


async def test_cancel_of_running_job_sets_its_cancel_key(store: JobStore) -> None:
    job_id = (await store.submit(REQUEST, model=MODEL, max_queued=0)).job_id
    await store.start(job_id, "worker-1", MODEL, lease_seconds=LEASE_SECONDS)
    answer, took_effect = await store.cancel(job_id)
    assert (answer.status, took_effect) == (JobState.running, True)
    assert await store.redis.exists(store.keys.cancel(job_id))


async def test_cancel_of_unknown_job_raises_job_not_found(store: JobStore) -> None:
    with pytest.raises(JobNotFound):
        await store.cancel(uuid.uuid4().hex)
    assert await prefix_keys(store.redis, store.keys) == set()


async def test_record_of_queued_job_has_a_queue_position(store: JobStore) -> None:
    first, second = [(await store.submit(REQUEST, model=MODEL, max_queued=0)).job_id for _ in range(2)]
    positions = {(await store.record(job_id)).queue_position for job_id in (first, second)}
    assert positions == {0, 1}
    await store.cancel(first)
    assert (await store.record(first)).queue_position is None
    assert (await store.record(second)).queue_position == 0


async def test_queue_position_counts_only_jobs_waiting_ahead(store: JobStore) -> None:
    running = (await store.submit(REQUEST, model=MODEL, max_queued=0)).job_id
    await store.start(running, "worker-1", MODEL, lease_seconds=LEASE_SECONDS)
    queued = (await store.submit(REQUEST, model=MODEL, max_queued=0)).job_id
    assert (await store.record(queued)).queue_position == 0


async def test_idempotency_key_expires_with_the_ended_job(store: JobStore) -> None:
    job_id = (await store.submit(REQUEST, model=MODEL, idempotency_key="k", max_queued=0)).job_id
    await store.cancel(job_id)
    assert 0 < await store.redis.ttl(store.keys.idempotency("k")) <= UNIT_RETENTION_SECONDS


async def test_a_chat_s_reasoning_and_tool_calls_are_in_its_record_while_it_runs_and_once_it_ended(
    store: JobStore,
) -> None:
    """The record's output reads them from the stream as the job runs, and keeps them once it ends."""
    job_id = (await store.submit(REQUEST, model=MODEL, max_queued=0)).job_id
    await store.start(job_id, "worker-1", MODEL, lease_seconds=LEASE_SECONDS)
    name = ToolCallDelta(index=0, id="call-1", type="function", function=FunctionDelta(name="get_weather"))
    arguments = ToolCallDelta(index=0, function=FunctionDelta(arguments='{"city": "Paris"}'))
    events: list[Event] = [
        DeltaEvent(seq=2, text="", token_ids=[1, 2], reasoning="Look it up."),
        DeltaEvent(seq=3, text="", token_ids=[3], tool_calls=[name]),
        DeltaEvent(seq=4, text="", token_ids=[4, 5], tool_calls=[arguments]),
    ]
    publisher = Publisher(store.streams, store, "worker-1")
    assert await publisher.step(job_id, events) is Verdict.go
    call = {"name": "get_weather", "arguments": '{"city": "Paris"}'}
    expected = [{"id": "call-1", "type": "function", "function": call}]
    running = (await store.record(job_id)).output
    assert (running.reasoning, running.token_count) == ("Look it up.", 5)
    assert [call.model_dump() for call in running.tool_calls or []] == expected
    done = DoneEvent(seq=5, finish_reason="tool_calls", usage=Usage(prompt_tokens=4, completion_tokens=5))
    finished = await publisher.finish(job_id, [done], Outcome.of_stream([*events, done]))
    assert finished.outcome is FinishOutcome.ended
    record = await store.record(job_id)
    assert (record.status, record.finish_reason, record.output.reasoning) == (
        JobState.completed,
        "tool_calls",
        "Look it up.",
    )
    assert [call.model_dump() for call in record.output.tool_calls or []] == expected
