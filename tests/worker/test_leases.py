"""Leases against the real Redis: start takes one, heartbeats renew it, reapers release lapsed ones
(requeue for a resume, or fail once out of attempts), deadlines fail queued jobs unrun."""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import datetime, timezone

import pytest

from shared.chat import FunctionCall, ToolCall
from shared.errors import BackendUnavailable
from shared.events import DeltaEvent, FunctionDelta, JobState, ToolCallDelta, Usage, event_adapter
from shared.jobstore import WORKER_LOST, JobStore
from shared.lifecycle.transitions import ReleaseOutcome, Verdict
from shared.requests import JobRecord, JobRequest
from tests.helpers import eventually
from tests.shared.transitions import claimed
from worker.leases import KEYS_EXTENDED_EVERY, Leases
from worker.publisher import Publisher

REQUEST = JobRequest(prompt="The capital of France is", max_tokens=8)
MODEL = "smol"
LEASE_SECONDS = 6.0


@pytest.fixture
def leases(store: JobStore) -> Leases:
    return Leases(store, store.settings)


async def started(store: JobStore, worker_id: str = "worker-1") -> str:
    job_id = (await store.submit(REQUEST, model=MODEL, max_queued=0)).job_id
    assert await store.start(job_id, worker_id, MODEL, lease_seconds=LEASE_SECONDS) is not None
    return job_id


async def lapse(store: JobStore, job_id: str) -> None:
    """What a lease's TTL does when its worker stops renewing it."""
    await store.redis.delete(store.keys.lease(job_id))


async def events(store: JobStore, job_id: str) -> list[dict[str, object]]:
    entries = await store.redis.xrange(store.keys.stream(job_id))
    return [event_adapter.validate_json(fields["data"]).model_dump() for _, fields in entries]


async def test_start_takes_the_lease_for_its_worker_and_counts_the_first_attempt(store: JobStore) -> None:
    job_id = await started(store)
    assert await store.redis.get(store.keys.lease(job_id)) == "worker-1"
    assert 0 < await store.redis.pttl(store.keys.lease(job_id)) <= LEASE_SECONDS * 1000
    assert await store.redis.sismember(store.keys.running, job_id)
    assert (await store.record(job_id)).attempts == 1
    running = (await events(store, job_id))[1]
    assert (running["state"], running["attempt"], running["resumed"]) == ("running", 1, False)


async def test_renew_extends_own_leases_and_reports_lost_ones_without_bringing_them_back(
    store: JobStore, leases: Leases
) -> None:
    mine, lapsed, taken = [await started(store) for _ in range(3)]
    await store.redis.pexpire(store.keys.lease(mine), 100)
    await lapse(store, lapsed)
    await store.redis.set(store.keys.lease(taken), "worker-2")
    assert await leases.renew("worker-1", [mine, lapsed, taken]) == [lapsed, taken]
    assert await store.redis.pttl(store.keys.lease(mine)) > 100
    assert not await store.redis.exists(store.keys.lease(lapsed))
    assert await store.redis.get(store.keys.lease(taken)) == "worker-2"


async def test_renewals_extend_a_jobs_keys_first_then_every_quarter_lifetime_and_after_a_failure(
    store: JobStore, leases: Leases, monkeypatch: pytest.MonkeyPatch
) -> None:
    job_id = await started(store)
    keys = (store.keys.job(job_id), store.keys.stream(job_id))
    every = store.settings.job_lifetime_seconds * KEYS_EXTENDED_EVERY

    async def renewed() -> bool:
        """Whether a renewal (which always extends the lease) extended the job's keys too."""
        for key in keys:
            await store.redis.expire(key, 100)
        await store.redis.pexpire(store.keys.lease(job_id), 100)
        assert await leases.renew("worker-1", [job_id]) == []
        assert await store.redis.pttl(store.keys.lease(job_id)) > 100
        return all([await store.redis.ttl(key) > 100 for key in keys])

    assert await renewed()  # the first renewal of a job
    assert not await renewed()  # the next ones, for a quarter of a lifetime: its lease alone
    leases.extended[job_id] -= every  # as a quarter of a lifetime later
    assert await renewed()
    assert not await renewed()

    async def unreachable(*_: object, **__: object) -> list[str]:
        raise ConnectionError("Redis is away")

    with monkeypatch.context() as patch:
        patch.setattr(leases.store, "renew", unreachable)
        with pytest.raises(BackendUnavailable):
            await leases.renew("worker-1", [job_id])
    assert await renewed()  # the renewal after a failed one: it may have been lost with its Redis


async def test_reap_requeues_a_job_whose_lease_lapsed_for_another_worker_to_run(
    store: JobStore, leases: Leases
) -> None:
    job_id, held = await started(store), await started(store)
    await lapse(store, job_id)
    assert await leases.lapsed() == [(job_id, MODEL)]
    async with store.redis.pubsub() as wakeups:
        await wakeups.subscribe(store.keys.model(MODEL).wakeup)
        await leases.reap("worker-2")
        woken = [await wakeups.get_message(timeout=5) for _ in range(2)]  # subscribe's answer, then the job
    assert [message["data"] for message in woken if message] == [1, job_id]  # idle workers take it at once

    assert (await store.record(job_id)).status is JobState.running  # states never move backwards
    assert await store.redis.zscore(store.keys.model(MODEL).queue, job_id) is not None
    assert not await store.redis.sismember(store.keys.running, job_id)
    assert await store.redis.sismember(store.keys.running, held)
    assert (
        await leases.release(job_id, MODEL, "again") is ReleaseOutcome.requeued
    )  # a second reaper changes nothing
    assert await claimed(store, worker="worker-2", model=MODEL) == [job_id]  # the lapsed run holds it no more


async def test_one_worker_a_turn_looks_for_lapsed_leases_and_the_turn_passes_once_it_ends(
    store: JobStore,
) -> None:
    """Every worker asks every interval; the one that takes the turn looks, the others do not until it
    ends, a little before its holder's next look (so one that died holds it less than an interval)."""
    first, second = Leases(store, store.settings), Leases(store, store.settings)
    first.reap_every = second.reap_every = 60.0  # a turn no loaded machine outlasts within the test
    await first.reap("worker-1")  # its turn: nothing has lapsed yet
    job_id = await started(store)
    await lapse(store, job_id)
    await second.reap("worker-2")  # not its turn: the job stays where it is
    assert await store.redis.sismember(store.keys.running, job_id)
    assert 0 < await store.redis.pttl(store.keys.reaper_turn) <= 54_000  # 0.9 of the interval
    await store.redis.pexpire(store.keys.reaper_turn, 1)  # the turn's time runs out
    await eventually(
        lambda: store.redis.exists(store.keys.reaper_turn), "the turn ended", until=lambda n: n == 0
    )
    await second.reap("worker-2")
    assert not await store.redis.sismember(store.keys.running, job_id)
    assert await store.redis.zscore(store.keys.model(MODEL).queue, job_id) is not None


async def test_a_requeued_job_resumes_with_its_stream_and_the_next_attempt(
    store: JobStore, leases: Leases
) -> None:
    job_id = await started(store)
    first_run = Publisher(store.redis, store, "worker-1")
    await first_run.step(job_id, [DeltaEvent(seq=2, text="Paris", token_ids=[42, 43])])
    await lapse(store, job_id)
    await leases.reap("worker-2")

    resumed = await store.start(job_id, "worker-2", MODEL, lease_seconds=LEASE_SECONDS)
    assert resumed is not None and resumed.resumed and resumed.attempt == 2
    assert (resumed.progress.next_seq, resumed.progress.token_ids, resumed.progress.text) == (
        3,
        [42, 43],
        "Paris",
    )
    assert await store.redis.zscore(store.keys.model(MODEL).queue, job_id) is None
    assert await store.redis.get(store.keys.lease(job_id)) == "worker-2"
    record = await store.record(job_id)
    assert (record.status, record.attempts, record.worker) == (JobState.running, 2, "worker-2")
    assert await first_run.step(job_id, [DeltaEvent(seq=3, text="!", token_ids=[1])]) is Verdict.lost
    # Only one worker resumes it.
    assert await store.start(job_id, "worker-3", MODEL, lease_seconds=LEASE_SECONDS) is None


async def test_a_job_out_of_attempts_fails_with_worker_lost_and_the_output_it_streamed(
    store_factory: Callable[..., JobStore],
) -> None:
    """The failed record keeps what the stream holds, as a worker's end would: the text, the model's
    reasoning, its tool calls and the tokens generated."""
    store = store_factory(max_attempts=1)
    job_id = await started(store)
    await think_and_call(store, job_id)
    await lapse(store, job_id)
    await Leases(store, store.settings).reap("worker-2")

    stream = await events(store, job_id)
    assert [event["seq"] for event in stream] == [0, 1, 2, 3, 4]
    assert (stream[-1]["type"], stream[-1]["code"]) == ("error", WORKER_LOST)
    assert "max_attempts" in str(stream[-1]["message"])
    record = await store.record(job_id)
    assert (record.status, record.error) == (JobState.failed, stream[-1]["message"])
    assert_thought_and_called(record)
    assert await store.redis.zscore(store.keys.model(MODEL).queue, job_id) is None
    assert 0 < await store.redis.ttl(store.keys.stream(job_id)) <= store.settings.retention_seconds


async def test_a_job_cancelled_while_handed_back_ends_with_the_output_it_streamed(store: JobStore) -> None:
    """No worker holds it, so the cancel ends it from its stream, keeping what a worker's end would."""
    job_id = await started(store)
    await think_and_call(store, job_id)
    assert await store.release(job_id, MODEL, "stopping", worker_id="worker-1", max_attempts=3) is (
        ReleaseOutcome.requeued
    )
    answer, took_effect = await store.cancel(job_id)
    assert took_effect and answer.status is JobState.cancelled
    record = await store.record(job_id)
    assert record.status is JobState.cancelled
    assert_thought_and_called(record)
    assert (await events(store, job_id))[-1] == {
        "type": "cancelled",
        "seq": 4,
        "usage": record.usage.model_dump(),
    }


async def think_and_call(store: JobStore, job_id: str) -> None:
    """worker-1 streams a thought, then text with a tool call, one token each."""
    call = ToolCallDelta(
        index=0, id="call_1", type="function", function=FunctionDelta(name="f", arguments="{}")
    )
    thought = DeltaEvent(seq=2, text="", token_ids=[4], reasoning="Hm.")
    await Publisher(store.redis, store, "worker-1").step(
        job_id, [thought, DeltaEvent(seq=3, text="Par", token_ids=[5], tool_calls=[call])]
    )


def assert_thought_and_called(record: JobRecord) -> None:
    """The record of a job that ended after `think_and_call` keeps its output whole, and its tokens."""
    assert (record.output.text, record.output.token_count, record.output.reasoning) == ("Par", 2, "Hm.")
    assert record.output.tool_calls == [
        ToolCall(id="call_1", function=FunctionCall(name="f", arguments="{}"))
    ]
    assert record.usage == Usage(prompt_tokens=0, completion_tokens=2)
    assert record.finished_at is not None


async def test_a_worker_hands_back_its_own_job_at_once_but_not_another_workers(
    store: JobStore, leases: Leases
) -> None:
    job_id = await started(store)
    assert await leases.release(job_id, MODEL, "stopping", "worker-2") is ReleaseOutcome.held
    assert (
        await leases.release(job_id, MODEL, "stopping") is ReleaseOutcome.held
    )  # a reaper leaves a live lease alone
    assert await leases.release(job_id, MODEL, "stopping", "worker-1") is ReleaseOutcome.requeued
    assert not await store.redis.exists(store.keys.lease(job_id))


async def test_a_queued_job_past_its_deadline_fails_when_a_worker_would_start_it(store: JobStore) -> None:
    past = JobRequest(prompt="hi", deadline=datetime(2020, 1, 1, tzinfo=timezone.utc))
    job_id = (await store.submit(past, model=MODEL, max_queued=0)).job_id
    assert await store.start(job_id, "worker-1", MODEL, lease_seconds=LEASE_SECONDS) is None
    stream = await events(store, job_id)
    assert [(event["type"], event["seq"]) for event in stream] == [("status", 0), ("error", 1)]
    assert stream[-1]["code"] == "deadline_exceeded"
    record = await store.record(job_id)
    assert (record.status, record.started_at, record.attempts) == (JobState.failed, None, 0)
    assert await store.redis.zscore(store.keys.model(MODEL).queue, job_id) is None
    assert not await store.redis.exists(store.keys.lease(job_id))


async def test_a_deadline_still_ahead_lets_the_job_start(store: JobStore) -> None:
    ahead = JobRequest.model_validate({"prompt": "hi", "deadline": time.time() + 3600})
    job_id = (await store.submit(ahead, model=MODEL, max_queued=0)).job_id
    assert await store.start(job_id, "worker-1", MODEL, lease_seconds=LEASE_SECONDS) is not None
    assert (await store.record(job_id)).status is JobState.running


async def test_a_late_hand_back_of_an_earlier_run_leaves_the_run_that_resumed_the_job_alone(
    store: JobStore, leases: Leases
) -> None:
    """A run that gave up while Redis was away hands back late, after its own worker resumed the job."""
    job_id = await started(store)
    assert (
        await leases.release(job_id, MODEL, "its worker lost Redis", "worker-1", 1) is ReleaseOutcome.requeued
    )
    assert await store.start(job_id, "worker-1", MODEL, lease_seconds=LEASE_SECONDS) is not None
    assert await leases.release(job_id, MODEL, "its worker lost Redis", "worker-1", 1) is ReleaseOutcome.held
    record = await store.record(job_id)
    assert (record.status, record.attempts) == (JobState.running, 2)
    assert await store.redis.get(store.keys.lease(job_id)) == "worker-1"
