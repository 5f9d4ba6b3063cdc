"""The publisher against the real Redis: batched steps, cancel and lease checks, ordered events,
terminal writes."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import redis.asyncio as aioredis

from shared.errors import BackendUnavailable
from shared.events import DeltaEvent, DoneEvent, ErrorEvent, Event, JobState, Usage, event_adapter
from shared.jobstore import JobStore, Outcome
from shared.keys import Keys
from shared.lifecycle.transitions import Finished, FinishOutcome, Verdict
from shared.requests import JobRequest
from tests.conftest import UNIT_RETENTION_SECONDS, make_settings
from tests.faults.conftest import RedisServer
from tests.helpers import eventually
from tests.processes import Processes, free_port
from tests.shared.transitions import lose_last_entries
from worker.publisher import CHECK_AFTER_SECONDS, Publisher

USAGE = Usage(prompt_tokens=5, completion_tokens=2)
COMPLETED = Outcome(JobState.completed, "ab", 2, USAGE, finish_reason="stop")


WORKER = "worker-1"
MODEL = "smol"
LEASE_SECONDS = 6.0


@pytest.fixture
def publisher(store: JobStore) -> Publisher:
    return Publisher(store.redis, store, WORKER)


def delta(seq: int, text: str = "a", token_id: int = 1) -> DeltaEvent:
    return DeltaEvent(seq=seq, text=text, token_ids=[token_id])


async def started_job(store: JobStore) -> str:
    job_id = (await store.submit(JobRequest(prompt="hi", max_tokens=2), model=MODEL, max_queued=0)).job_id
    assert await store.start(job_id, WORKER, MODEL, lease_seconds=LEASE_SECONDS) is not None
    return job_id


async def stream_length_after_start(store: JobStore, job_ids: list[str]) -> list[int]:
    return [await store.redis.xlen(store.keys.stream(job_id)) - 2 for job_id in job_ids]


async def stream_events(store: JobStore, job_id: str) -> list[Event]:
    """The stream's events, each checked against its entry: type, id made of its seq, a write time."""
    entries = await store.redis.xrange(store.keys.stream(job_id))
    assert all(set(fields) == {"type", "data", "at"} for _, fields in entries)
    events = [event_adapter.validate_json(fields["data"]) for _, fields in entries]
    assert [event.type for event in events] == [fields["type"] for _, fields in entries]
    assert [entry_id for entry_id, _ in entries] == [f"{event.seq}-1" for event in events]
    return events


async def test_concurrent_steps_of_many_jobs_share_a_round_trip(
    store: JobStore, publisher: Publisher
) -> None:
    job_ids = [await started_job(store) for _ in range(50)]
    publisher.round_trips = 0
    verdicts = await asyncio.gather(*(publisher.step(job_id, [delta(2)]) for job_id in job_ids))
    assert verdicts == [Verdict.go] * 50
    assert publisher.round_trips <= 2
    assert await stream_length_after_start(store, job_ids) == [1] * 50


async def test_step_reports_cancel_once_a_cancel_is_asked(store: JobStore, publisher: Publisher) -> None:
    job_id, other = await started_job(store), await started_job(store)
    assert await publisher.step(job_id, [delta(2)]) is Verdict.go
    await store.cancel(job_id)
    answers = await asyncio.gather(publisher.step(job_id, [delta(3)]), publisher.step(other, [delta(2)]))
    assert answers == [Verdict.cancel, Verdict.go]
    assert job_id in publisher.cancels_asked_at  # for the cancel latency


async def test_step_without_events_still_checks_cancel(store: JobStore, publisher: Publisher) -> None:
    job_id = await started_job(store)
    await store.cancel(job_id)
    assert await publisher.step(job_id, []) is Verdict.cancel
    assert await stream_length_after_start(store, [job_id]) == [0]


async def test_step_appends_events_in_order_with_type_and_data(store: JobStore, publisher: Publisher) -> None:
    job_id = await started_job(store)
    await publisher.step(job_id, [delta(2, "a", 10), delta(3, "b", 11), delta(4, "c", 12)])
    await publisher.step(job_id, [delta(5, "d", 13)])
    events = (await stream_events(store, job_id))[2:]
    assert events == [delta(2, "a", 10), delta(3, "b", 11), delta(4, "c", 12), delta(5, "d", 13)]


async def test_a_worker_without_the_lease_appends_nothing_and_learns_it_lost_the_job(
    store: JobStore, publisher: Publisher
) -> None:
    job_id = await started_job(store)
    intruder = Publisher(store.redis, store, "worker-2")
    assert await intruder.step(job_id, [delta(2)]) is Verdict.lost
    failed = Outcome(JobState.failed, "", 0, USAGE, error="not mine")
    assert await intruder.finish(
        job_id, [ErrorEvent(seq=2, message="x", code="internal")], failed
    ) == Finished(FinishOutcome.lost)
    await store.redis.delete(store.keys.lease(job_id))  # lapsed: not even its first worker may write
    assert await publisher.step(job_id, [delta(2)]) is Verdict.lost
    assert await store.redis.xlen(store.keys.stream(job_id)) == 2
    assert (await store.record(job_id)).status is JobState.running


@pytest.fixture
async def private_store(tmp_path: Path) -> AsyncIterator[JobStore]:
    """A store on a redis-server of its own, for a test that flushes the server's scripts."""
    processes = Processes(tmp_path)
    url = processes.start_redis("redis", free_port(), tmp_path / "data", "--appendonly", "no")
    client = aioredis.Redis.from_url(url, decode_responses=True)
    settings = make_settings(url)
    yield JobStore(client, Keys.of(settings), settings)
    await client.aclose()
    processes.stop_all()


async def test_a_step_after_redis_lost_its_scripts_loads_the_script_and_goes_through(
    private_store: JobStore,
) -> None:
    publisher = Publisher(private_store.redis, private_store, WORKER)
    job_id = await started_job(private_store)
    assert await publisher.step(job_id, [delta(2)]) is Verdict.go
    await private_store.redis.script_flush()  # what a restarted Redis has forgotten
    assert await publisher.step(job_id, [delta(3)]) is Verdict.go
    assert [event.seq for event in await stream_events(private_store, job_id)] == [0, 1, 2, 3]


async def test_finish_writes_terminal_event_last_and_ends_the_record(
    store: JobStore, publisher: Publisher
) -> None:
    job_id = await started_job(store)
    await publisher.step(job_id, [delta(2, "a")])
    done = DoneEvent(seq=4, finish_reason="stop", usage=USAGE)
    assert await publisher.finish(job_id, [delta(3, "b"), done], COMPLETED) == Finished(
        FinishOutcome.ended, JobState.completed
    )

    events = await stream_events(store, job_id)
    assert [event.type for event in events] == ["status", "status", "delta", "delta", "done"]
    assert events[-1] == done
    assert not await store.redis.exists(store.keys.lease(job_id))
    assert not await store.redis.sismember(store.keys.running, job_id)
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
    assert answer == Finished(FinishOutcome.not_running, JobState.completed)
    record = await store.record(job_id)
    assert (record.status, record.error) == (JobState.completed, None)
    assert [event.type for event in await stream_events(store, job_id)] == ["status", "status", "done"]


async def test_finish_of_a_cancelled_queued_job_writes_no_terminal_state(
    store: JobStore, publisher: Publisher
) -> None:
    job_id = (await store.submit(JobRequest(prompt="hi", max_tokens=2), model=MODEL, max_queued=0)).job_id
    await store.cancel(job_id)
    done = DoneEvent(seq=2, finish_reason="stop", usage=USAGE)
    assert await publisher.finish(job_id, [done], COMPLETED) == Finished(
        FinishOutcome.not_running, JobState.cancelled
    )
    assert (await store.record(job_id)).status is JobState.cancelled
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


@dataclass
class Restartable:
    """A store on a redis-server of its own (with its append-only file), which a test stops and
    starts again, or fills up."""

    server: RedisServer
    store: JobStore

    def publisher(self) -> Publisher:
        """A publisher that sends a failed step again for a whole lease, as a worker's does."""
        return Publisher(self.store.redis, self.store, WORKER, resend_seconds=LEASE_SECONDS)

    async def step_through_a_restart(self, publisher: Publisher, job_id: str, event: DeltaEvent) -> Verdict:
        """The step `event`, sent while the server is down, as answered once it is back."""
        await asyncio.to_thread(self.server.stop)
        step = await step_meets_a_failure(publisher, job_id, event)
        await asyncio.to_thread(self.server.start)
        return await step


@pytest.fixture
async def restartable(tmp_path: Path) -> AsyncIterator[Restartable]:
    processes = Processes(tmp_path)
    server = RedisServer(processes, free_port(), tmp_path / "data")
    url = server.start()
    client = aioredis.Redis.from_url(url, decode_responses=True)
    settings = make_settings(url)
    yield Restartable(server, JobStore(client, Keys.of(settings), settings))
    await client.aclose()
    processes.stop_all()


async def step_meets_a_failure(publisher: Publisher, job_id: str, event: DeltaEvent) -> asyncio.Task[Verdict]:
    """A step under way that has met a failed round trip at least once."""
    sent = publisher.round_trips
    task = asyncio.create_task(publisher.step(job_id, [event]))
    await eventually(lambda: asyncio.sleep(0, publisher.round_trips > sent + 1), "the step is sent again")
    assert not task.done()
    return task


async def test_a_step_through_a_redis_restart_is_written_once_when_redis_is_back(
    restartable: Restartable,
) -> None:
    store, publisher = restartable.store, restartable.publisher()
    job_id = await started_job(store)
    assert await publisher.step(job_id, [delta(2)]) is Verdict.go
    assert await restartable.step_through_a_restart(publisher, job_id, delta(3)) is Verdict.go
    assert [event.seq for event in await stream_events(store, job_id)] == [0, 1, 2, 3]


async def test_a_step_through_a_full_redis_is_written_once_redis_has_room(restartable: Restartable) -> None:
    store, publisher = restartable.store, restartable.publisher()
    job_id = await started_job(store)
    await store.redis.config_set("maxmemory-policy", "noeviction")
    await store.redis.config_set("maxmemory", 1)  # every write is refused: OOM command not allowed
    step = await step_meets_a_failure(publisher, job_id, delta(2))
    await store.redis.config_set("maxmemory", 0)
    assert await step is Verdict.go
    assert [event.seq for event in await stream_events(store, job_id)] == [0, 1, 2]


async def test_events_a_failover_lost_are_written_again_with_their_ids_before_the_next_step(
    restartable: Restartable,
) -> None:
    store, publisher = restartable.store, restartable.publisher()
    job_id = await started_job(store)
    sent = [delta(2, "a", 1), delta(3, "b", 2), delta(4, "c", 3)]
    for event in sent:
        assert await publisher.step(job_id, [event]) is Verdict.go
    # A stand-in for a failover: the server that answers next lacks the last two steps, as a replica
    # promoted before it received them does, and the publisher's round trips fail meanwhile.
    await lose_last_entries(store, job_id, 2)
    assert await restartable.step_through_a_restart(publisher, job_id, delta(5, "d", 4)) is Verdict.go
    events = await stream_events(store, job_id)  # ids checked there: each its event's seq
    assert [event.seq for event in events] == [0, 1, 2, 3, 4, 5]
    assert events[2:] == [*sent, delta(5, "d", 4)]  # the lost ones as they were first written
    # A job's end reads its stream always, and finds a lost step too.
    assert await publisher.step(job_id, [delta(6)]) is Verdict.go
    await lose_last_entries(store, job_id, 1)
    done = DoneEvent(seq=7, finish_reason="stop", usage=USAGE)
    assert (await publisher.finish(job_id, [done], COMPLETED)).outcome is FinishOutcome.ended
    assert [event.seq for event in await stream_events(store, job_id)] == list(range(8))


async def test_a_step_handed_over_while_a_round_trip_fails_reads_its_stream_first(
    restartable: Restartable,
) -> None:
    """A job's step that waits for the next round trip while the one in flight fails reads its
    stream first, though the next round trip goes through at once (a failover's new master already
    answering): else it would append after the steps the failover lost, leaving a gap."""
    store, publisher = restartable.store, restartable.publisher()
    first, second = await started_job(store), await started_job(store)
    for job_id in (first, second):
        assert await publisher.step(job_id, [delta(2, "a", 1)]) is Verdict.go
    await lose_last_entries(store, second, 1)  # the failover's loss
    admin = aioredis.Redis.from_url(f"redis://127.0.0.1:{restartable.server.port}/0", decode_responses=True)
    await admin.client_pause(10_000, all=False)  # writes wait: the next round trip stays in flight
    stepping = asyncio.create_task(publisher.step(first, [delta(3, "b", 2)]))
    await eventually(lambda: asyncio.sleep(0, not publisher._pending), "the first job's step in flight")
    waiting = asyncio.create_task(publisher.step(second, [delta(3, "b", 2)]))
    await eventually(lambda: asyncio.sleep(0, bool(publisher._pending)), "the second job's step waiting")
    await admin.execute_command("CLIENT", "KILL", "TYPE", "normal", "SKIPME", "yes")  # the round trip fails
    await admin.client_unpause()
    assert await stepping is Verdict.go and await waiting is Verdict.go
    events = await stream_events(store, second)
    assert events[2:] == [delta(2, "a", 1), delta(3, "b", 2)]  # the lost step written again, then this one
    await admin.aclose()


async def test_a_step_after_a_pause_longer_than_a_failover_reads_its_stream_first(
    store: JobStore, publisher: Publisher
) -> None:
    job_id = await started_job(store)
    assert await publisher.step(job_id, [delta(2, "a", 1)]) is Verdict.go
    await lose_last_entries(store, job_id, 1)  # a failover during the pause, met by no round trip
    await asyncio.sleep(CHECK_AFTER_SECONDS + 0.1)
    assert await publisher.step(job_id, [delta(3, "b", 2)]) is Verdict.go
    events = await stream_events(store, job_id)
    assert events[2:] == [delta(2, "a", 1), delta(3, "b", 2)]


async def test_a_step_after_lost_events_no_longer_kept_learns_the_stream_is_behind(
    restartable: Restartable,
) -> None:
    store, publisher = restartable.store, restartable.publisher()
    job_id = await started_job(store)
    assert await publisher.step(job_id, [delta(2)]) is Verdict.go
    publisher.forget(job_id)
    await lose_last_entries(store, job_id, 1)
    assert await restartable.step_through_a_restart(publisher, job_id, delta(3)) is Verdict.behind
    assert [event.seq for event in await stream_events(store, job_id)] == [0, 1]
    assert (await publisher.finish(job_id, [delta(3)], COMPLETED)).outcome is FinishOutcome.behind
    assert (await store.record(job_id)).status is JobState.running


async def test_a_step_that_cannot_be_written_for_a_whole_lease_fails(restartable: Restartable) -> None:
    store = restartable.store
    publisher = Publisher(store.redis, store, WORKER, resend_seconds=0.3)
    job_id = await started_job(store)
    await asyncio.to_thread(restartable.server.stop)
    with pytest.raises(BackendUnavailable):
        await publisher.step(job_id, [delta(2)])
