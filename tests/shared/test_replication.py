"""Acknowledged only once a replica holds it: a submission, a cancel and a job's end, on a real master
and replica (two `redis-server` processes of the test's own). A replica that stops acknowledging is
one frozen with SIGSTOP: still connected, so the master waits for it, as for one cut off."""

from __future__ import annotations

import signal
from collections.abc import AsyncIterator, Iterator

import pytest
import redis.asyncio as aioredis

from shared.errors import BackendUnavailable
from shared.events import DoneEvent, JobState, Usage
from shared.jobstore import JobStore, Outcome
from shared.keys import Keys
from shared.lifecycle.transitions import FinishOutcome
from shared.requests import JobRequest
from tests.conftest import make_settings
from tests.processes import Processes
from tests.replicated_redis import ReplicatedRedis
from worker.publisher import Publisher

REQUEST = JobRequest(prompt="hi", max_tokens=2)
WORKER = "worker-1"
USAGE = Usage(prompt_tokens=1, completion_tokens=0)


@pytest.fixture
def replicated(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ReplicatedRedis]:
    processes = Processes(tmp_path_factory.mktemp("replicated"))
    try:
        yield ReplicatedRedis.start(processes)
    finally:
        processes.stop_all()


@pytest.fixture
async def master(replicated: ReplicatedRedis) -> AsyncIterator[aioredis.Redis]:
    client = aioredis.Redis.from_url(replicated.url("master"), decode_responses=True)
    yield client
    await client.aclose()


def store_of(master: aioredis.Redis, replicated: ReplicatedRedis, **overrides: object) -> JobStore:
    # 1 s: a frozen replica fails a WAIT only after it, and a live one on a busy machine is within it.
    settings = make_settings(replicated.url("master"), replica_ack_timeout_ms=1000, **overrides)
    return JobStore(master, Keys(settings.key_prefix), settings)


async def test_a_submission_is_acknowledged_once_the_replica_holds_it(
    master: aioredis.Redis, replicated: ReplicatedRedis
) -> None:
    store = store_of(master, replicated)
    job_id = (await store.submit(REQUEST, model="smol", max_queued=0)).job_id
    with replicated.client("replica") as replica:
        assert replica.hget(store.keys.job(job_id), "status") == "queued"
        assert replica.zscore(store.keys.model("smol").queue, job_id) is not None


async def test_a_submission_no_replica_acknowledges_answers_unavailable_saying_the_job_may_exist(
    master: aioredis.Redis, replicated: ReplicatedRedis
) -> None:
    store = store_of(master, replicated, min_replicas_to_ack=1)
    replicated.processes.signal("replica", signal.SIGSTOP)
    try:
        with pytest.raises(BackendUnavailable, match="0 of the 1 Redis replicas") as refused:
            await store.submit(REQUEST, model="smol", max_queued=0)
        assert "retry with the same Idempotency-Key" in refused.value.message
        job_id = refused.value.message.split()[1]
        assert await master.hget(store.keys.job(job_id), "status") == "queued"  # written, not acknowledged
    finally:
        replicated.processes.signal("replica", signal.SIGCONT)


async def test_a_cancel_no_replica_acknowledges_answers_unavailable(
    master: aioredis.Redis, replicated: ReplicatedRedis
) -> None:
    store = store_of(master, replicated, min_replicas_to_ack=1)
    job_id = (await store.submit(REQUEST, model="smol", max_queued=0)).job_id
    replicated.processes.signal("replica", signal.SIGSTOP)
    try:
        with pytest.raises(BackendUnavailable, match=f"the cancel of job {job_id} reached 0 of the 1"):
            await store.cancel(job_id)
    finally:
        replicated.processes.signal("replica", signal.SIGCONT)
    answer, took_effect = await store.cancel(job_id)  # acknowledged now: it had ended it already
    assert (answer.status, took_effect) == (JobState.cancelled, False)


async def test_a_retry_on_a_connection_that_never_wrote_is_acknowledged_only_once_the_first_write_is(
    master: aioredis.Redis, replicated: ReplicatedRedis
) -> None:
    """A retry that finds its work done writes nothing itself, and WAIT is documented to count only its
    own connection's writes: the fence written before it makes it cover the first sending's. (Redis
    7.0 also counts every write made before any command of the connection, so here the retry would
    wait without the fence too: the test holds the behaviour, whichever makes it.)"""
    store = store_of(master, replicated, min_replicas_to_ack=1)
    replicated.processes.signal("replica", signal.SIGSTOP)
    other = aioredis.Redis.from_url(replicated.url("master"), decode_responses=True)
    retry = JobStore(other, store.keys, store.settings)
    try:
        with pytest.raises(BackendUnavailable, match="0 of the 1"):
            await store.submit(REQUEST, model="smol", max_queued=0, idempotency_key="once")
        with pytest.raises(BackendUnavailable, match="0 of the 1"):  # the replica has not got it yet
            await retry.submit(REQUEST, model="smol", max_queued=0, idempotency_key="once")
        replicated.processes.signal("replica", signal.SIGCONT)
        again = await retry.submit(REQUEST, model="smol", max_queued=0, idempotency_key="once")
        assert not again.created
        with replicated.client("replica") as replica:
            assert replica.hget(store.keys.job(again.job_id), "status") == "queued"
    finally:
        replicated.processes.signal("replica", signal.SIGCONT)
        await other.aclose()


async def test_a_jobs_end_is_sent_again_until_the_replica_holds_it(
    master: aioredis.Redis, replicated: ReplicatedRedis
) -> None:
    store = store_of(master, replicated, min_replicas_to_ack=1)
    job_id = (await store.submit(REQUEST, model="smol", max_queued=0)).job_id
    assert await store.start(job_id, WORKER, "smol", lease_seconds=30) is not None
    publisher = Publisher(master, store, WORKER, resend_seconds=0.2)
    outcome = Outcome(JobState.completed, "", 0, USAGE, finish_reason="stop")
    replicated.processes.signal("replica", signal.SIGSTOP)
    try:
        with pytest.raises(BackendUnavailable, match="a job's end reached 0 of the 1"):
            await publisher.finish(job_id, [DoneEvent(seq=2, finish_reason="stop", usage=USAGE)], outcome)
    finally:
        replicated.processes.signal("replica", signal.SIGCONT)
    resent = await publisher.finish(job_id, [DoneEvent(seq=2, finish_reason="stop", usage=USAGE)], outcome)
    assert (resent.outcome, resent.state) == (FinishOutcome.not_running, JobState.completed)
    assert await master.xlen(store.keys.stream(job_id)) == 3  # queued, running, done: once


async def test_without_a_replica_online_the_default_acknowledges_at_once(
    master: aioredis.Redis, replicated: ReplicatedRedis
) -> None:
    store = store_of(master, replicated)
    await store.submit(REQUEST, model="smol", max_queued=0)  # the store sees the replica online
    replicated.kill("replica")
    # The replica is gone, but the store counts it from its last look: one submission is refused.
    with pytest.raises(BackendUnavailable, match="0 of the 1"):
        await store.submit(REQUEST, model="smol", max_queued=0)
    submitted = await store.submit(REQUEST, model="smol", max_queued=0)
    assert await master.hget(store.keys.job(submitted.job_id), "status") == "queued"
