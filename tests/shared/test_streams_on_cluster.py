"""The job streams on a real Redis Cluster (three masters and a replica of each, `redis-server`
processes of the module's own), the rest on the suite's Redis: jobs spread over partitions on every
master, each step one call a partition and one round trip a master, followed through a hub that hears
each master's shard channels and reads each master on a connection of its own, which follows a slot
that moved; and the same over TLS, on a cluster that takes TLS alone. A master SIGKILLed mid-stream is
tests/e2e/test_streams_on_cluster.py's, with the gateways and workers as processes of their own:
redis-py 5.3.1's cluster client lets go of a node it maps anew with its connections open, to the
garbage collector, whose warnings would fail whichever test of this process ran then."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass

import pytest
import redis.asyncio as aioredis
from redis.crc import key_slot
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import RedisClusterException

from gateway.admission import fullest_memory
from gateway.relay.cluster_notices import ClusterNotices
from gateway.relay.hub import StreamHub
from gateway.relay.notices import bulk
from gateway.relay.open_streams import StreamLimits
from gateway.relay.relay import Relay
from shared.events import DeltaEvent, DoneEvent, JobState, Usage
from shared.jobstore import JobStore, Outcome
from shared.keys import Keys
from shared.lifecycle.transitions import FinishOutcome, Verdict
from shared.redis_client import close_cluster, connect_cluster
from shared.requests import JobRequest
from tests.conftest import UNIT_RETENTION_SECONDS, delete_test_keys, make_settings
from tests.helpers import eventually
from tests.processes import Processes
from tests.redis_cluster import ClusteredRedis, Tls
from tests.shared.transitions import MODEL, WORKER
from worker.publisher import Publisher

REQUEST = JobRequest(prompt="The capital of France is", max_tokens=8)
LEASE_SECONDS = 60.0  # longer than a failover: the worker keeps sending its steps through it
LIMITS = StreamLimits(most=100, most_per_owner=100, batch_bytes=65536)
USAGE = Usage(prompt_tokens=5, completion_tokens=2)
STEP_SECONDS = 0.02
FOLLOW_SECONDS = 60.0
NOTICED_SECONDS = 20.0  # far more than the steps take, far less than the hub's sweep put off


@pytest.fixture
async def store(
    redis_client: aioredis.Redis, redis_url: str, redis_cluster: ClusteredRedis
) -> AsyncIterator[JobStore]:
    settings = make_settings(
        redis_url, retention_seconds=UNIT_RETENTION_SECONDS, streams_redis_url=redis_cluster.url
    )
    keys = Keys.of(settings)
    assert keys.partitions == settings.stream_partitions
    streams = connect_cluster(redis_cluster.url, "streams-test", 16)
    made = JobStore(redis_client, keys, settings, streams)
    yield made
    await delete_test_keys(redis_client, keys)
    await streams.aclose()


@pytest.fixture
async def relay(store: JobStore, redis_cluster: ClusteredRedis) -> AsyncIterator[Relay]:
    reader = connect_cluster(redis_cluster.url, store.keys.stream_reader_name, 4)
    hub = StreamHub(ClusterNotices(reader, store.keys))
    yield Relay(store.redis, store.keys, hub, store.streams)
    await hub.close()


async def started_jobs(store: JobStore, count: int) -> list[str]:
    jobs = []
    for _ in range(count):
        job_id = (await store.submit(REQUEST, model=MODEL, max_queued=0)).job_id
        assert await store.start(job_id, WORKER, MODEL, lease_seconds=LEASE_SECONDS) is not None
        jobs.append(job_id)
    return jobs


async def follow(relay: Relay, job_id: str) -> list[tuple[str, str]]:
    """Every entry of the job's stream, (id, type), as a client following it from the start gets them."""
    following, hold = await relay.open(job_id, "0", "anonymous", LIMITS)
    try:
        return [(entry.id, entry.type) async for batch in following.batches(5.0) for entry in batch]
    finally:
        hold.release()


async def run(publisher: Publisher, job_id: str, deltas: int) -> None:
    """The job's steps, a delta each, then its end, as a worker sends them."""
    for seq in range(2, 2 + deltas):
        assert await publisher.step(job_id, [DeltaEvent(seq=seq, text="a", token_ids=[1])]) is Verdict.go
        await asyncio.sleep(STEP_SECONDS)
    done = DoneEvent(seq=2 + deltas, finish_reason="length", usage=USAGE)
    outcome = Outcome(JobState.completed, "a" * deltas, deltas, USAGE, "length")
    assert (await publisher.finish(job_id, [done], outcome)).outcome is FinishOutcome.ended


def whole(deltas: int) -> list[str]:
    return ["status", "status", *["delta"] * deltas, "done"]


async def test_jobs_on_every_master_are_stepped_one_call_a_partition_and_followed(
    store: JobStore, relay: Relay, redis_cluster: ClusteredRedis, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The followers get every entry from the masters' shard channels: the hub's sweep, which would
    read every stream in any case, is put off past the test's end."""
    monkeypatch.setattr("gateway.relay.hub.SWEEP_SECONDS", 600.0)
    jobs = await started_jobs(store, 24)
    masters = {redis_cluster.master_of(store.keys.stream(job_id)) for job_id in jobs}
    assert masters == set(redis_cluster.masters())  # the partitions spread the jobs over them all
    publisher = Publisher(store.streams, store, WORKER)
    followers = [asyncio.create_task(follow(relay, job_id)) for job_id in jobs]
    await asyncio.sleep(0.2)
    await asyncio.gather(*(run(publisher, job_id, 10) for job_id in jobs))
    followed = await asyncio.wait_for(asyncio.gather(*followers), NOTICED_SECONDS)
    for job_id, entries in zip(jobs, followed, strict=True):
        assert [kind for _, kind in entries] == whole(10)
        assert [entry_id for entry_id, _ in entries] == [f"{seq}-1" for seq in range(13)]
        record = await store.redis.hgetall(store.keys.job(job_id))  # type: ignore[misc]
        assert record["status"] == "completed" and record["text"] == "a" * 10
    # a round trip carries every job's step in one call a partition touched, not one a job
    assert publisher.round_trips < 24 * 11


async def test_a_cancel_reaches_a_job_on_the_cluster(store: JobStore) -> None:
    (job_id,) = await started_jobs(store, 1)
    await store.cancel(job_id)
    publisher = Publisher(store.streams, store, WORKER)
    assert await publisher.step(job_id, [DeltaEvent(seq=2, text="a", token_ids=[1])]) is Verdict.cancel
    queued = (await store.submit(REQUEST, model=MODEL, max_queued=0)).job_id
    answer, _ = await store.cancel(queued)
    assert answer.status is JobState.cancelled
    entries = await store.streams.xrange(store.keys.stream(queued))
    assert [fields["type"] for _, fields in entries] == ["status", "cancelled"]


async def test_a_job_past_its_deadline_ends_on_the_cluster_with_no_worker_to_start_it(
    store: JobStore,
) -> None:
    """The deadline sweep ends the record on the control plane, then the stream on its master."""
    jobs = [(await store.submit(REQUEST, model=MODEL, max_queued=0, deadline=0.0)).job_id for _ in range(6)]
    assert await store.expire_due([MODEL]) == len(jobs)
    for job_id in jobs:
        assert (await store.record(job_id)).status is JobState.failed
        entries = await store.streams.xrange(store.keys.stream(job_id))
        assert [fields["type"] for _, fields in entries] == ["status", "error"]


def test_partitions_name_their_slot_in_the_data_plane_keys_alone() -> None:
    keys = Keys("sp", 16)
    job_id = uuid.uuid4().hex
    tag = keys.partition_tag(keys.partition(job_id))
    assert tag in keys.stream(job_id) and tag in keys.writer(job_id)
    assert tag in keys.partition_notices(keys.partition(job_id))
    assert "{" not in keys.job(job_id) + keys.lease(job_id) + keys.cancel(job_id)
    assert Keys("sp").stream(job_id) == f"sp:job:{job_id}:events"


@pytest.mark.parametrize(("partitions", "masters"), [(16, 2), (16, 3), (16, 4), (12, 3), (64, 5)])
def test_partitions_fall_as_evenly_as_they_can_on_masters_of_equal_slot_ranges(
    partitions: int, masters: int
) -> None:
    """As `redis-cli --cluster create` divides the slots: each master holds the partitions' even
    share, rounded up or down."""
    keys = Keys("sp", partitions)
    slots = [key_slot(keys.partition_tag(partition)[1:-1].encode()) for partition in range(partitions)]
    held = [
        sum(1 for slot in slots if master * 16384 // masters <= slot < (master + 1) * 16384 // masters)
        for master in range(masters)
    ]
    assert sum(held) == partitions
    assert max(held) - min(held) <= 1


async def test_admission_reads_the_memory_of_the_fullest_master(
    store: JobStore, redis_cluster: ClusteredRedis
) -> None:
    """With the streams on a cluster, the mark for new jobs is the fullest of the control plane and
    every master: one master given a small `maxmemory` is the one read."""
    fullest = redis_cluster.masters()[1]
    with redis_cluster.client(fullest) as node:
        used = int(node.info("memory")["used_memory"])
        node.config_set("maxmemory", used * 2)
        try:
            memory = await fullest_memory(store.redis, store.streams)
        finally:
            node.config_set("maxmemory", 0)
    assert memory.limit == used * 2
    assert 0.3 < memory.share() < 0.7


@dataclass(frozen=True)
class Read:
    """A stream for `ClusterNotices.read`, as the hub hands it one."""

    stream: str
    cursor: str = "0"

    @property
    def name(self) -> bytes:
        return bulk(self.stream)


async def test_the_hubs_reads_follow_a_moved_slot_and_never_read_a_master_that_lost_it(
    store: JobStore, redis_cluster: ClusteredRedis
) -> None:
    """The hub's reads go to each master on connections of their own, by the cluster's slot map: once
    a stream's slot moved, a read meets MOVED and fails (the hub then drops its reads and reads again),
    and the read after the drop, which maps the nodes anew, finds the stream on its new master."""
    reader = connect_cluster(redis_cluster.url, store.keys.stream_reader_name, 4)
    notices = ClusterNotices(reader, store.keys)
    streams = [store.keys.stream(uuid.uuid4().hex) for _ in range(12)]  # on every master, most likely
    moved = streams[0]
    slot, source = redis_cluster.slot_of(moved), redis_cluster.master_of(moved)
    target = next(name for name in redis_cluster.masters() if name != source)
    try:
        for stream in streams:
            await store.streams.xadd(stream, {"n": "0"}, id="1-1")
        found = dict(await notices.read([Read(stream) for stream in streams], 10))
        assert found == {stream: [["1-1", ["n", "0"]]] for stream in streams}
        await asyncio.to_thread(redis_cluster.move_slot, slot, target)
        await store.streams.xadd(moved, {"n": "1"}, id="2-1")
        with pytest.raises(RedisConnectionError, match="no longer serves"):
            await notices.read([Read(stream, "1-1") for stream in streams], 10)
        await notices.drop()
        found = dict(await notices.read([Read(stream, "1-1") for stream in streams], 10))
        assert found == {moved: [["2-1", ["n", "1"]]]}
    finally:
        await notices.aclose()
        await store.streams.delete(*streams)
        await asyncio.to_thread(redis_cluster.move_slot, slot, source)  # as the module's other tests had it


@pytest.fixture(scope="module")
def tls_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ClusteredRedis]:
    """Three masters that take TLS connections alone, from clients and from one another."""
    processes = Processes(tmp_path_factory.mktemp("redis-cluster-tls"))
    try:
        yield ClusteredRedis.start(processes, replicas=0, tls=Tls.make(processes.log_dir / "tls"))
    finally:
        processes.stop_all()


async def test_a_cluster_on_tls_alone_carries_the_streams_through_a_rediss_cluster_url(
    tls_cluster: ClusteredRedis,
) -> None:
    """A managed cluster with encryption in transit: through `rediss+cluster://`, streams are written
    on every master, and a gateway's hub hears their partitions' notices and reads them; a plain URL
    is answered by no node."""
    plain = connect_cluster(tls_cluster.url.replace("rediss+", "redis+").partition("?")[0], "plain", 2)
    with pytest.raises((RedisClusterException, RedisConnectionError, TimeoutError)):
        await asyncio.wait_for(plain.ping(), 2)  # a node on TLS may wait for a handshake that never comes
    await close_cluster(plain)
    keys = Keys(f"tls-{uuid.uuid4().hex}", 16)
    client = connect_cluster(tls_cluster.url, "streams-test", 4)
    notices = ClusterNotices(connect_cluster(tls_cluster.url, keys.stream_reader_name, 2), keys)
    heard: list[str] = []
    subscribed = asyncio.Event()
    listening = asyncio.create_task(notices.listen(heard.append, lambda _, __: subscribed.set(), 1.0))
    jobs = [uuid.uuid4().hex for _ in range(24)]
    streams = [keys.stream(job_id) for job_id in jobs]
    try:
        assert {tls_cluster.master_of(stream) for stream in streams} == set(tls_cluster.masters())
        await asyncio.wait_for(subscribed.wait(), NOTICED_SECONDS)
        for job_id, stream in zip(jobs, streams, strict=True):
            await client.xadd(stream, {"n": "1"}, id="1-1")
            await client.execute_command("SPUBLISH", keys.partition_notices(keys.partition(job_id)), stream)

        async def all_heard() -> bool:
            return sorted(heard) == sorted(streams)

        await eventually(all_heard, "every notice heard over TLS")
        found = dict(await notices.read([Read(stream) for stream in streams], 10))
        assert found == {stream: [["1-1", ["n", "1"]]] for stream in streams}
    finally:
        listening.cancel()
        await asyncio.gather(listening, return_exceptions=True)
        await notices.aclose()
        await client.delete(*streams)
        await client.aclose()
