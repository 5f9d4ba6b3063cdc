"""The job streams on a Redis of their own (`streams_redis_url`): every transition in its two parts,
each on its own `redis-server`, and a job left whole when its caller stops between them.

The streams' Redis is a private `redis-server` of this module's; the rest lives on the suite's Redis.
A script on one cannot touch a key of the other, so a part that reached for the wrong one would find
nothing there. A caller stopping between a transition's two writes is the fault hook
`Planes.between_planes` raising, a test double for a crash at that point: a real kill cannot be
timed between two round trips."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
import redis.asyncio as aioredis

from gateway.admission import fullest_memory
from gateway.relay.hub import StreamHub
from gateway.relay.open_streams import StreamLimits
from gateway.relay.relay import HEAL_SECONDS, Relay
from gateway.relay.server_notices import ServerNotices
from shared.errors import JobNotFound
from shared.events import CancelledEvent, DeltaEvent, DoneEvent, ErrorEvent, JobState, Usage
from shared.jobstore import JobStore, Outcome
from shared.keys import Keys
from shared.lifecycle.transitions import Failure, FinishOutcome, ReleaseOutcome, Verdict
from shared.redis_client import connect_reader
from shared.requests import JobRequest
from tests.conftest import UNIT_RETENTION_SECONDS, delete_test_keys, make_settings
from tests.shared.transitions import MODEL, WORKER, release
from worker.publisher import Publisher

REQUEST = JobRequest(prompt="The capital of France is", max_tokens=8)
LEASE_SECONDS = 6.0
USAGE = Usage(prompt_tokens=5, completion_tokens=2)
LIMITS = StreamLimits(most=10, most_per_owner=10, batch_bytes=65536)


class Stopped(Exception):
    """The caller stopped between a transition's two writes (`Planes.between_planes`)."""


@pytest.fixture
async def store(redis_client: aioredis.Redis, redis_url: str, streams_url: str) -> AsyncIterator[JobStore]:
    retention = UNIT_RETENTION_SECONDS
    settings = make_settings(redis_url, retention_seconds=retention, streams_redis_url=streams_url)
    streams = aioredis.Redis.from_url(streams_url, decode_responses=True)
    made = JobStore(redis_client, Keys.of(settings), settings, streams)
    yield made
    await delete_test_keys(redis_client, made.keys)
    await delete_test_keys(streams, made.keys)
    await streams.aclose()


def stop_at(store: JobStore, transition: str) -> None:
    """Have the store's caller stop between `transition`'s two writes."""

    def stop(at: str) -> None:
        if at == transition:
            raise Stopped(at)

    store.planes.between_planes = stop


async def submitted(store: JobStore) -> str:
    return (await store.submit(REQUEST, model=MODEL, max_queued=0)).job_id


async def started(store: JobStore, worker_id: str = WORKER) -> str:
    job_id = await submitted(store)
    assert await store.start(job_id, worker_id, MODEL, lease_seconds=LEASE_SECONDS) is not None
    return job_id


async def stream_types(store: JobStore, job_id: str) -> list[str]:
    return [fields["type"] for _, fields in await store.streams.xrange(store.keys.stream(job_id))]


async def status(store: JobStore, job_id: str) -> str | None:
    value: str | None = await store.redis.hget(store.keys.job(job_id), "status")  # type: ignore[misc]
    return value


def delta(seq: int, text: str = "a") -> DeltaEvent:
    return DeltaEvent(seq=seq, text=text, token_ids=[1])


def done(seq: int) -> DoneEvent:
    return DoneEvent(seq=seq, finish_reason="length", usage=USAGE)


COMPLETED = Outcome(JobState.completed, "ab", 2, USAGE, "length")


async def test_each_redis_holds_only_its_own_keys(store: JobStore) -> None:
    """The record and the lease on the suite's Redis; the stream and its writer on the streams'."""
    job_id = await started(store)
    keys = store.keys
    assert await store.redis.exists(keys.job(job_id), keys.lease(job_id)) == 2
    assert await store.redis.exists(keys.stream(job_id), keys.writer(job_id)) == 0
    assert await store.streams.exists(keys.stream(job_id), keys.writer(job_id)) == 2
    assert await store.streams.exists(keys.job(job_id), keys.lease(job_id)) == 0
    assert await store.streams.get(keys.writer(job_id)) == WORKER
    assert await stream_types(store, job_id) == ["status", "status"]
    assert 0 < await store.streams.ttl(keys.stream(job_id)) <= store.settings.job_lifetime_seconds


async def test_a_job_runs_and_ends_through_the_publisher(store: JobStore) -> None:
    """Steps go to the streams' Redis alone; the end reaches the stream, then the record."""
    job_id = await started(store)
    publisher = Publisher(store.streams, store, WORKER)
    assert await publisher.step(job_id, [delta(2), delta(3, "b")]) is Verdict.go
    finished = await publisher.finish(job_id, [done(4)], COMPLETED)
    assert finished.outcome is FinishOutcome.ended
    assert await status(store, job_id) == "completed"
    assert await stream_types(store, job_id) == ["status", "status", "delta", "delta", "done"]
    assert not await store.streams.exists(store.keys.writer(job_id))
    assert 0 < await store.streams.ttl(store.keys.stream(job_id)) <= UNIT_RETENTION_SECONDS
    assert not await store.redis.sismember(store.keys.running, job_id)  # type: ignore[misc]
    # its end sent again (its first answer lost) finds it done, not lost
    assert (await publisher.finish(job_id, [done(4)], COMPLETED)).outcome is FinishOutcome.not_running


async def test_a_worker_that_lost_the_job_appends_nothing_and_the_next_resumes_after_it(
    store: JobStore,
) -> None:
    job_id = await started(store)
    first = Publisher(store.streams, store, WORKER)
    assert await first.step(job_id, [delta(2)]) is Verdict.go
    assert await release(store, job_id, attempt=1) is ReleaseOutcome.requeued
    assert not await store.streams.exists(store.keys.writer(job_id))
    assert await first.step(job_id, [delta(3)]) is Verdict.lost
    resumed = await store.start(job_id, "worker-2", MODEL, lease_seconds=LEASE_SECONDS)
    assert resumed is not None and resumed.attempt == 2
    assert resumed.progress.next_seq == 3 and resumed.progress.text == "a"
    assert await first.step(job_id, [delta(3)]) is Verdict.lost
    assert await Publisher(store.streams, store, "worker-2").step(job_id, [delta(3)]) is Verdict.go


async def test_a_cancel_ends_a_queued_job_in_both_and_reaches_a_running_one_at_its_next_step(
    store: JobStore,
) -> None:
    queued = await submitted(store)
    answer, took_effect = await store.cancel(queued)
    assert took_effect and answer.status is JobState.cancelled
    assert await stream_types(store, queued) == ["status", "cancelled"]

    running = await started(store)
    await store.cancel(running)
    assert (await store.streams.get(store.keys.writer(running)) or "").startswith(f"{WORKER}@")
    assert await Publisher(store.streams, store, WORKER).step(running, [delta(2)]) is Verdict.cancel


async def test_a_job_no_worker_holds_ends_cancelled_and_out_of_attempts_fails(store: JobStore) -> None:
    requeued = await started(store)
    assert await Publisher(store.streams, store, WORKER).step(requeued, [delta(2)]) is Verdict.go
    assert await release(store, requeued, attempt=1) is ReleaseOutcome.requeued
    answer, _ = await store.cancel(requeued)
    assert answer.status is JobState.cancelled
    assert await stream_types(store, requeued) == ["status", "status", "delta", "cancelled"]
    fields = await store.redis.hgetall(store.keys.job(requeued))  # type: ignore[misc]
    assert fields["text"] == "a" and fields["token_count"] == "1"

    exhausted = await started(store)
    for attempt in (1, 2):
        assert await release(store, exhausted, attempt=attempt) is ReleaseOutcome.requeued
        assert await store.start(exhausted, WORKER, MODEL, lease_seconds=LEASE_SECONDS) is not None
    assert await release(store, exhausted, attempt=3) is ReleaseOutcome.exhausted
    entries = await store.streams.xrange(store.keys.stream(exhausted))
    failure = Failure(
        event=ErrorEvent(seq=2, message="gone", code="worker_lost"),
        fields={},
        stream_tip=entries[-1][0],
    )
    assert await release(store, exhausted, attempt=3, failure=failure) is ReleaseOutcome.failed
    assert await status(store, exhausted) == "failed"
    assert (await stream_types(store, exhausted))[-1] == "error"


async def test_a_refused_submission_leaves_no_stream(store: JobStore) -> None:
    job_id = await submitted(store)
    again = await store.submit(REQUEST, model=MODEL, max_queued=0, idempotency_key="once")
    replay = await store.submit(REQUEST, model=MODEL, max_queued=0, idempotency_key="once")
    assert replay.job_id == again.job_id
    streams = [name async for name in store.streams.scan_iter(match=f"{store.keys.prefix}:job:*:events")]
    assert sorted(streams) == sorted([store.keys.stream(job_id), store.keys.stream(again.job_id)])


async def test_a_submission_stopped_after_its_stream_makes_no_job(store: JobStore) -> None:
    """Its stream names no record, nothing queues it, and it expires."""
    stop_at(store, "submit")
    with pytest.raises(Stopped):
        await submitted(store)
    (stream,) = [name async for name in store.streams.scan_iter(match=f"{store.keys.prefix}:job:*:events")]
    job_id = stream.removeprefix(f"{store.keys.prefix}:job:").removesuffix(":events")
    assert await status(store, job_id) is None
    assert await store.redis.zcard(store.keys.model(MODEL).queue) == 0
    assert 0 < await store.streams.ttl(stream) <= store.settings.job_lifetime_seconds


async def test_a_worker_stopped_between_its_end_and_the_record_has_the_job_end_as_the_stream_says(
    store: JobStore,
) -> None:
    """The stream ended and the record did not: the job is handed on when its lease lapses, and the
    worker that starts it next ends the record from the stream instead of running it again."""
    job_id = await started(store)
    publisher = Publisher(store.streams, store, WORKER)
    assert await publisher.step(job_id, [delta(2), delta(3, "b")]) is Verdict.go
    stop_at(store, "finish")
    with pytest.raises(Stopped):
        await publisher.finish(job_id, [done(4)], COMPLETED)
    assert await status(store, job_id) == "running"
    assert (await stream_types(store, job_id))[-1] == "done"
    store.planes.between_planes = None
    await store.redis.delete(store.keys.lease(job_id))  # its lease lapses
    assert await release(store, job_id, attempt=0) is ReleaseOutcome.requeued
    assert await store.start(job_id, "worker-2", MODEL, lease_seconds=LEASE_SECONDS) is None
    fields = await store.redis.hgetall(store.keys.job(job_id))  # type: ignore[misc]
    assert fields["status"] == "completed" and fields["text"] == "ab" and fields["finish_reason"] == "length"
    assert not await store.redis.sismember(store.keys.running, job_id)  # type: ignore[misc]
    assert (await stream_types(store, job_id)).count("done") == 1


@pytest.fixture
async def relay(store: JobStore, streams_url: str) -> AsyncIterator[Relay]:
    hub = StreamHub(ServerNotices(connect_reader(streams_url, store.keys.stream_reader_name), store.keys))
    yield Relay(store.redis, store.keys, hub, store.streams)
    await hub.close()


async def test_a_reader_follows_the_stream_on_its_own_redis(store: JobStore, relay: Relay) -> None:
    job_id = await started(store)
    publisher = Publisher(store.streams, store, WORKER)

    async def run() -> None:
        await asyncio.sleep(0.2)
        await publisher.step(job_id, [delta(2)])
        await publisher.finish(job_id, [done(3)], COMPLETED)

    running = asyncio.create_task(run())
    following, hold = await relay.open(job_id, "0", "anonymous", LIMITS)
    types = [entry.type async for batch in following.batches(5.0) for entry in batch]
    hold.release()
    await running
    assert types == ["status", "status", "delta", "done"]
    with pytest.raises(JobNotFound):
        await relay.check(job_id, "0", "someone-else", LIMITS)


async def test_an_end_stopped_between_the_record_and_the_stream_is_healed_by_a_reader(
    store: JobStore, relay: Relay, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A cancel that ended the record and stopped before the stream: a reader sees the job running
    (so waits rather than stop short of the end) until `HEAL_SECONDS` after the record's end, then
    ends the stream with the terminal event the record keeps."""
    job_id = await submitted(store)
    stop_at(store, "cancel")
    with pytest.raises(Stopped):
        await store.cancel(job_id)
    assert await status(store, job_id) == "cancelled"
    assert await stream_types(store, job_id) == ["status"]
    state, _, _ = await relay.check(job_id, "0", "anonymous", LIMITS)
    assert state is JobState.running
    finished_at = float(await store.redis.hget(store.keys.job(job_id), "finished_at"))  # type: ignore[misc]
    monkeypatch.setattr("gateway.relay.relay.time.time", lambda: finished_at + HEAL_SECONDS + 1)
    state, _, entries = await relay.check(job_id, "0", "anonymous", LIMITS, count=10)
    assert state is JobState.cancelled
    assert await stream_types(store, job_id) == ["status", "cancelled"]
    assert not await relay.ended(job_id, "0")
    last = (await store.streams.xrevrange(store.keys.stream(job_id), count=1))[0][0]
    assert await relay.ended(job_id, last)


async def test_admission_reads_the_memory_of_the_streams_redis_too(store: JobStore) -> None:
    """New jobs are refused by the fuller of the two: the streams' Redis, given a small `maxmemory`,
    is the one read."""
    used = int((await store.streams.info("memory"))["used_memory"])
    await store.streams.config_set("maxmemory", used * 2)
    try:
        memory = await fullest_memory(store.redis, store.streams)
    finally:
        await store.streams.config_set("maxmemory", 0)
    assert memory.limit == used * 2


async def test_a_start_stopped_before_the_stream_is_handed_on_when_its_lease_lapses(store: JobStore) -> None:
    """The record says running and the lease is the worker's, its writer was never set: the worker's
    steps would be refused; its lease lapses, the reaper hands the job back, and the next start runs it."""
    job_id = await submitted(store)
    stop_at(store, "start")
    with pytest.raises(Stopped):
        await store.start(job_id, WORKER, MODEL, lease_seconds=LEASE_SECONDS)
    store.planes.between_planes = None
    assert await status(store, job_id) == "running"
    assert not await store.streams.exists(store.keys.writer(job_id))
    assert await Publisher(store.streams, store, WORKER).step(job_id, [delta(1)]) is Verdict.lost
    await store.redis.delete(store.keys.lease(job_id))  # its lease lapses
    assert await release(store, job_id, attempt=0) is ReleaseOutcome.requeued
    resumed = await store.start(job_id, "worker-2", MODEL, lease_seconds=LEASE_SECONDS)
    assert resumed is not None and resumed.attempt == 2 and resumed.progress.next_seq == 1
    assert await Publisher(store.streams, store, "worker-2").step(job_id, [delta(1)]) is Verdict.go


async def test_a_release_stopped_before_the_writer_went_lets_the_next_start_fence_the_old_worker(
    store: JobStore,
) -> None:
    """The job is handed back in its record, the old worker's writer still stands: its steps still go
    in until the next start takes the writer, which then reads the stream after them."""
    job_id = await started(store)
    old = Publisher(store.streams, store, WORKER)
    stop_at(store, "release")
    with pytest.raises(Stopped):
        await release(store, job_id, attempt=1)
    store.planes.between_planes = None
    assert await old.step(job_id, [delta(2)]) is Verdict.go
    resumed = await store.start(job_id, "worker-2", MODEL, lease_seconds=LEASE_SECONDS)
    assert resumed is not None and resumed.progress.next_seq == 3 and resumed.progress.text == "a"
    assert await old.step(job_id, [delta(3)]) is Verdict.lost
    assert await Publisher(store.streams, store, "worker-2").step(job_id, [delta(3)]) is Verdict.go


async def test_a_deletion_stopped_before_the_stream_leaves_it_to_expire(store: JobStore) -> None:
    job_id = await submitted(store)
    await store.cancel(job_id)
    stop_at(store, "delete")
    with pytest.raises(Stopped):
        await store.delete(job_id)
    assert await status(store, job_id) is None
    assert 0 < await store.streams.ttl(store.keys.stream(job_id)) <= UNIT_RETENTION_SECONDS


async def test_a_cancel_stopped_before_the_record_still_ends_the_running_job(store: JobStore) -> None:
    """The writer carries the ask first: the worker's next step ends the job cancelled, and its end
    reaches the record, although the cancel never did."""
    job_id = await started(store)
    stop_at(store, "cancel asked")
    with pytest.raises(Stopped):
        await store.cancel(job_id)
    assert not await store.redis.exists(store.keys.cancel(job_id))
    publisher = Publisher(store.streams, store, WORKER)
    assert await publisher.step(job_id, [delta(2)]) is Verdict.cancel
    cancelled = Outcome(JobState.cancelled, "a", 1, USAGE)
    ending = [CancelledEvent(seq=3, usage=USAGE)]
    assert (await publisher.finish(job_id, ending, cancelled)).outcome is FinishOutcome.ended
    assert await status(store, job_id) == "cancelled"
    assert (await stream_types(store, job_id))[-1] == "cancelled"


async def test_a_start_whose_stream_is_gone_runs_nothing(store: JobStore) -> None:
    """A stream the streams' Redis lost (a failover before its replica had it): the start refuses,
    and the job is handed on when its lease lapses, as any start that runs nothing."""
    job_id = await submitted(store)
    await store.streams.delete(store.keys.stream(job_id))
    assert await store.start(job_id, WORKER, MODEL, lease_seconds=LEASE_SECONDS) is None
