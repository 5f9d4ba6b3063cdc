"""Acknowledged only once a replica holds it: a submission, a cancel and a job's end, on a real master
and replica (two `redis-server` processes of the test's own). A replica that stops acknowledging is
one frozen with SIGSTOP: still connected, so the master waits for it, as for one cut off. A replica
promoted while its old master answers is a partition, seen through a real gateway process."""

from __future__ import annotations

import signal
import uuid
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest
import redis
import redis.asyncio as aioredis

from shared.errors import BackendUnavailable
from shared.events import DoneEvent, JobState, Usage
from shared.jobstore import JobStore, Outcome
from shared.keys import Keys
from shared.lifecycle.transitions import FinishOutcome
from shared.requests import JobRequest
from tests.conftest import make_settings
from tests.gateway.keyed_gateway import run_gateway
from tests.helpers import eventually_sync
from tests.processes import Processes, free_port
from tests.replicated_redis import ReplicatedRedis
from worker.publisher import Publisher

REQUEST = JobRequest(prompt="hi", max_tokens=2)
JOB = REQUEST.model_dump(exclude_none=True)
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
    return JobStore(master, Keys.of(settings), settings)


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


async def test_the_default_waits_for_a_replica_once_seen_until_a_setting_asks_for_fewer(
    master: aioredis.Redis, replicated: ReplicatedRedis
) -> None:
    store = store_of(master, replicated)
    await store.submit(REQUEST, model="smol", max_queued=0)  # the store sees the replica
    replicated.kill("replica")
    for _ in range(2):  # the second one too, though the first one's shortfall made it look again
        with pytest.raises(BackendUnavailable, match="0 of the 1"):
            await store.submit(REQUEST, model="smol", max_queued=0)
    later = JobStore(master, store.keys, store.settings)  # a process started after the replica went
    with pytest.raises(BackendUnavailable, match="0 of the 1"):
        await later.submit(REQUEST, model="smol", max_queued=0)
    fewer = JobStore(master, store.keys, store.settings.model_copy(update={"min_replicas_to_ack": 0}))
    submitted = await fewer.submit(REQUEST, model="smol", max_queued=0)
    assert await master.hget(store.keys.job(submitted.job_id), "status") == "queued"


@contextmanager
def gateway_on(url: str, folder: Path, **overrides: object) -> Iterator[httpx.Client]:
    """A gateway process on the Redis at `url`, with no worker (the jobs it takes stay queued)."""
    folder.mkdir()
    overrides = {"allow_unauthenticated": True, "replica_ack_timeout_ms": 300, **overrides}
    running = contextmanager(run_gateway)(url, folder, **overrides)
    with running as gateway, httpx.Client(base_url=gateway.base_url, timeout=30) as client:
        yield client


def test_a_replica_promoted_while_its_old_master_answers_leaves_no_acknowledged_job_behind(
    replicated: ReplicatedRedis, tmp_path: Path
) -> None:
    """A partition: the replica is promoted (REPLICAOF NO ONE, as Sentinel does) while the gateways
    still reach the old master, which answers. No submission may then be acknowledged: it would be on
    the old master only, and a job the new master lacks is lost."""
    url, keys = replicated.url("master"), Keys(f"sptest-{uuid.uuid4().hex[:8]}")
    with gateway_on(url, tmp_path / "before", key_prefix=keys.prefix) as gateway:
        first = gateway.post("/v1/jobs", json=JOB)
        assert first.status_code == 202, first.text  # the gateway has seen the replica
        with replicated.client("replica") as promoted:
            promoted.replicaof("NO", "ONE")
        with replicated.client("master") as old:
            eventually_sync(lambda: old.info("replication")["connected_slaves"] == 0, "the replica left")
        answers = [gateway.post("/v1/jobs", json=JOB) for _ in range(4)]
        # A gateway started now has never seen the replica itself.
        with gateway_on(url, tmp_path / "after", key_prefix=keys.prefix) as later:
            answers += [later.post("/v1/jobs", json=JOB) for _ in range(2)]
    acknowledged = [answer.json()["id"] for answer in answers if answer.is_success]
    with replicated.client("replica") as promoted:
        assert promoted.exists(keys.job(first.json()["id"]))
        lost = [job_id for job_id in acknowledged if not promoted.exists(keys.job(job_id))]
    assert not lost, f"acknowledged, and not on the new master: {lost}"
    assert [answer.status_code for answer in answers] == [503] * len(answers)


def test_a_replica_in_its_first_sync_is_waited_for(tmp_path: Path) -> None:
    """A replica the master lists but has not sent its data yet (`wait_bgsave`) is one of the
    deployment's: a submission is acknowledged only once it holds the job."""
    processes, keys = Processes(tmp_path), Keys(f"sptest-{uuid.uuid4().hex[:8]}")
    try:
        master_port = free_port()
        # The master waits this long for more replicas before it starts their sync.
        url = processes.start_redis(
            "master", master_port, tmp_path / "master", "--repl-diskless-sync-delay", "60"
        )
        replica_url = processes.start_redis(
            "replica", free_port(), tmp_path / "replica", "--replicaof", "127.0.0.1", str(master_port)
        )
        master = redis.Redis.from_url(url, decode_responses=True)

        def syncing() -> bool:
            replica = master.info("replication").get("slave0")
            return isinstance(replica, dict) and replica["state"] == "wait_bgsave"

        eventually_sync(syncing, "the master lists its replica, not yet sent its data")
        with gateway_on(url, tmp_path / "gateway", key_prefix=keys.prefix) as gateway:
            waited = gateway.post("/v1/jobs", json=JOB)
            assert waited.status_code == 503, waited.text
            master.config_set("repl-diskless-sync-delay", 0)
            eventually_sync(lambda: master.info("replication")["slave0"]["state"] == "online", "online")
            taken = gateway.post("/v1/jobs", json=JOB)
            assert taken.status_code == 202, taken.text
            with redis.Redis.from_url(replica_url, decode_responses=True) as replica:
                assert replica.exists(keys.job(taken.json()["id"]))
        master.close()
    finally:
        processes.stop_all()
