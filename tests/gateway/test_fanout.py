"""The gateway's one stream reader against the real Redis: fan-out, wake-up, slow followers."""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import Collection, Iterator
from typing import Any

import httpx
import pytest
import redis
import redis.asyncio as aioredis

from gateway.relay.cursors import START
from gateway.relay.entries import Entry
from gateway.relay.following import IDLE_SECONDS
from gateway.relay.hub import StreamHub
from gateway.relay.open_streams import StreamLimits
from gateway.relay.relay import Relay
from gateway.relay.server_notices import ServerNotices
from gateway.relay.subscription import Subscription
from shared.config import GatewaySettings
from shared.events import DeltaEvent, DoneEvent, Event, JobState, Usage
from shared.jobstore import JobStore
from shared.keys import ANONYMOUS_OWNER
from shared.lifecycle import scripts
from shared.lifecycle.transitions import JobStep
from shared.notices import LINE, notice_line
from shared.redis_client import connect_reader
from shared.requests import JobRequest
from tests.conftest import make_settings
from tests.gateway.keyed_gateway import KeyedGateway
from tests.helpers import eventually, notify, read_sse, stream_reader_listening
from tests.shared.transitions import transitions

LIMITS = StreamLimits.of(GatewaySettings())
MODEL = "smol"
FIRST_DELTA = 2  # a job's stream holds its `queued` and `running` events first


async def _append(redis_client: aioredis.Redis, relay: Relay, job_id: str, kind: str = "delta") -> str:
    """An entry appended as the lifecycle's scripts append one: with its notice."""
    entry_id: str = await redis_client.xadd(relay.keys.stream(job_id), {"type": kind, "data": "{}"})
    await notify(redis_client, relay.keys, relay.keys.stream(job_id))
    return entry_id


async def _until_watched(relay: Relay, streams: int) -> None:
    async def watched() -> bool:
        return relay.hub.streams >= streams

    await eventually(watched, f"the hub watches {streams} streams", interval=0.01)


async def _follow_all(relay: Relay, job_id: str, cursor: str = START) -> list[str]:
    return [entry.id async for batch in relay.follow(job_id, cursor).batches(IDLE_SECONDS) for entry in batch]


async def test_many_followers_share_one_reader_which_reads_only_the_streams_a_notice_names(
    redis_client: aioredis.Redis, relay: Relay, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("gateway.relay.hub.SWEEP_SECONDS", 60.0)  # no sweep reads every stream meanwhile
    jobs = [uuid.uuid4().hex for _ in range(50)]
    for job_id in jobs:
        await _append(redis_client, relay, job_id, "status")
    followers = [asyncio.create_task(_follow_all(relay, job_id)) for job_id in jobs]
    await _until_watched(relay, len(jobs))
    channels = {relay.keys.notices_of(job_id) for job_id in jobs}  # one listener for 50 streams:
    assert {listeners for _, listeners in await redis_client.pubsub_numsub(*channels)} == {1}
    await eventually(lambda: asyncio.sleep(0, not relay.hub._due), "the new streams read", interval=0.01)
    named: list[int] = []
    read = relay.hub._source.read

    async def counted(due: Collection[Any], count: int) -> Any:
        named.append(len(due))
        return await read(due, count)

    monkeypatch.setattr(relay.hub._source, "read", counted)
    ends = {job_id: await _append(redis_client, relay, job_id, "done") for job_id in jobs}
    results = await asyncio.gather(*followers)
    assert [ids[-1] for ids in results] == [ends[job_id] for job_id in jobs]
    assert all(len(ids) == 2 for ids in results)
    assert sum(named) == len(jobs)  # each stream read once, for its one notice, however many watched


async def test_a_notice_missed_is_made_up_by_the_sweep(
    redis_client: aioredis.Redis, relay: Relay, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("gateway.relay.hub.SWEEP_SECONDS", 0.2)
    job_id = uuid.uuid4().hex
    await _append(redis_client, relay, job_id, "status")
    following = asyncio.create_task(_follow_all(relay, job_id))
    await _until_watched(relay, 1)
    end = await redis_client.xadd(relay.keys.stream(job_id), {"type": "done", "data": "{}"})  # no notice
    assert (await asyncio.wait_for(following, 30))[-1] == end


async def test_a_follower_that_falls_behind_catches_up_without_gap_or_duplicate(
    redis_client: aioredis.Redis, relay: Relay, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("gateway.relay.subscription.SUBSCRIBER_BUFFER", 4)
    job_id = uuid.uuid4().hex
    await _append(redis_client, relay, job_id, "status")
    follower = relay.follow(job_id, START).batches(IDLE_SECONDS)
    received = [entry.id for entry in await anext(follower)]
    reading = asyncio.create_task(anext(follower))  # catches up, subscribes, waits for more
    await _until_watched(relay, 1)
    for _ in range(40):
        await _append(redis_client, relay, job_id)
    await _append(redis_client, relay, job_id, "done")

    async def dropped() -> bool:  # the hub drops it once its mailbox overflows
        return relay.hub.streams == 0

    await eventually(dropped, "the hub drops the lagging follower", interval=0.01)
    received += [entry.id for entry in await reading]
    received += [entry.id async for batch in follower for entry in batch]
    stored = [entry_id for entry_id, _ in await redis_client.xrange(relay.keys.stream(job_id))]
    assert received == stored


async def test_a_wait_lasts_its_own_timeout_after_earlier_waits_ended_early() -> None:
    """The subscription keeps one timer across waits; a wait must not end at an earlier wait's deadline."""
    subscription = Subscription("a-stream", START, max_bytes=1 << 20)
    loop = asyncio.get_running_loop()
    try:
        waiting = asyncio.create_task(subscription.wait(0.2))
        await asyncio.sleep(0)  # the wait begins, with its timer
        subscription.offer([Entry("1-0", "delta", "{}")], size=2)
        await waiting
        assert [entry.id for entry in subscription.take()] == ["1-0"]
        began = loop.time()
        await subscription.wait(0.5)
        assert loop.time() - began >= 0.5
        assert subscription.take() == []
    finally:
        subscription.close()


async def test_waiting_long_polls_hold_no_redis_connection_each(redis_url: str, relay: Relay) -> None:
    """Twenty polls wait at once for their jobs' next entries: on the hub's one reader, not in a
    blocking XREAD apiece on the gateway's pool (whose connections carry a name of their own here)."""
    pool_name = f"{relay.keys.prefix}-pool"
    pool = aioredis.Redis.from_url(redis_url, decode_responses=True, client_name=pool_name)
    polling = Relay(pool, relay.keys, relay.hub)
    jobs = [uuid.uuid4().hex for _ in range(20)]
    cursors = [await _append(pool, polling, job_id, "status") for job_id in jobs]
    for job_id in jobs:
        await pool.hset(polling.keys.job(job_id), mapping={"status": "running", "owner": ANONYMOUS_OWNER})
    try:
        pages = [
            asyncio.create_task(polling.page(job_id, cursor, 10, 30, ANONYMOUS_OWNER, LIMITS))
            for job_id, cursor in zip(jobs, cursors, strict=True)
        ]
        await asyncio.wait_for(_until_watched(polling, len(jobs)), 10)
        ours = (pool_name, polling.keys.stream_reader_name)

        async def blocked() -> list[str]:
            return [c["name"] for c in await pool.client_list() if "b" in c["flags"] and c["name"] in ours]

        await eventually(lambda: stream_reader_listening(pool, polling.keys), "the hub listens to notices")
        assert await blocked() == []  # a poll blocking on the pool would be blocked all along
        ends = [await _append(pool, polling, job_id, "done") for job_id in jobs]
        answers = await asyncio.wait_for(asyncio.gather(*pages), 30)
        assert [[entry.id for entry in entries] for entries, _, _ in answers] == [[end] for end in ends]
        assert all(done for _, _, done in answers)
    finally:
        await pool.aclose()


async def test_a_long_poll_with_nothing_new_answers_empty_once_its_wait_is_over(
    relay: Relay, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("gateway.relay.hub.LINGER_SECONDS", 0.05)
    job_id = uuid.uuid4().hex
    cursor = await _append(relay.redis, relay, job_id, "status")
    await relay.redis.hset(relay.keys.job(job_id), mapping={"status": "running", "owner": ANONYMOUS_OWNER})
    loop = asyncio.get_running_loop()
    began = loop.time()
    entries, state, done = await relay.page(job_id, cursor, 10, 0.3, ANONYMOUS_OWNER, LIMITS)
    assert loop.time() - began >= 0.3
    assert (entries, state, done) == ([], JobState.running, False)
    # The poll's subscription ended with it, and its stream, watched a linger longer, is no more.
    await eventually(lambda: asyncio.sleep(0, relay.hub.streams == 0), "the linger over", interval=0.01)


async def test_a_long_poll_at_the_tip_waits_on_the_hub_without_reading_the_stream_itself(
    redis_url: str, relay: Relay, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The poll's check found the cursor at the stream's end: what comes after it, the hub brings
    (one round trip a poll fewer), also what came between the check and the subscription."""
    job_id = uuid.uuid4().hex
    cursor = await _append(relay.redis, relay, job_id, "status")
    await relay.redis.hset(relay.keys.job(job_id), mapping={"status": "running", "owner": ANONYMOUS_OWNER})
    reads: list[str] = []
    read, subscribe = relay.read, relay.hub.subscribe

    async def counted(job_id: str, cursor: str, count: int) -> list[Entry]:
        reads.append(cursor)
        return await read(job_id, cursor, count)

    blocking = redis.Redis.from_url(redis_url, decode_responses=True)  # subscribing awaits nothing

    @contextlib.contextmanager
    def late(stream: str, cursor: str, max_bytes: int) -> Iterator[Subscription]:
        blocking.xadd(stream, {"type": "delta", "data": "{}"})  # no notice: only a read finds it
        with subscribe(stream, cursor, max_bytes) as subscription:
            yield subscription

    monkeypatch.setattr(relay, "read", counted)
    monkeypatch.setattr(relay.hub, "subscribe", late)
    with blocking:
        entries, state, done = await relay.page(job_id, cursor, 10, 30, ANONYMOUS_OWNER, LIMITS)
    assert [entry.id for entry in entries] == (await _stored(relay, job_id))[1:]
    assert (state, done, reads) == (JobState.running, False, [])


async def test_a_stream_followed_right_after_the_last_one_left_is_heard_at_once(
    redis_client: aioredis.Redis, relay: Relay, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The last follower's leaving stops the notices' listener; a follower coming in the same moment
    gets a listener of its own, not the one on its way out (no sweep would make up for it here)."""
    monkeypatch.setattr("gateway.relay.hub.SWEEP_SECONDS", 60.0)
    first, second = relay.keys.stream(uuid.uuid4().hex), relay.keys.stream(uuid.uuid4().hex)
    with relay.hub.subscribe(first, START, 1 << 20):
        await eventually(lambda: stream_reader_listening(redis_client, relay.keys), "the hub listens")
    with relay.hub.subscribe(second, START, 1 << 20) as subscription:
        await eventually(lambda: stream_reader_listening(redis_client, relay.keys), "the hub listens again")
        entry_id = await redis_client.xadd(second, {"type": "done", "data": "{}"})
        await notify(redis_client, relay.keys, second)
        await asyncio.wait_for(subscription.wait(30), 30)
        assert [entry.id for entry in subscription.take()] == [entry_id]


async def test_lines_for_streams_not_watched_here_are_passed_over_without_a_read(
    relay: Relay, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With two gateways or more, most of a step's lines are for other gateways' clients: they are passed
    over, named or whole, with no read and nothing handed out; the watched stream's line is handed out."""
    monkeypatch.setattr("gateway.relay.hub.SWEEP_SECONDS", 60.0)
    watched, other = relay.keys.stream(uuid.uuid4().hex), relay.keys.stream(uuid.uuid4().hex)
    with relay.hub.subscribe(watched, "2-1", 1 << 20) as subscription:
        # Read once it is new, and once more as its notices' channel is heard (which may come later).
        partition = relay.hub._watched[watched].partition
        settled = lambda: not relay.hub._due and partition in relay.hub._heard  # noqa: E731
        await eventually(
            lambda: asyncio.sleep(0, settled()), "the new stream read, its channel heard", interval=0.01
        )
        reads = ReadCount(relay, monkeypatch)
        lines = [
            notice_line(other, "3-1", "delta", "1700000000000", "{}"),
            other,
            notice_line(watched, "3-1", "delta", "1700000000000", '{"seq":3}'),
            notice_line(other, "9-1", "done", "1700000000000", "{}"),
        ]
        relay.hub._notice(LINE.join(lines))
        assert subscription.take() == [Entry("3-1", "delta", '{"seq":3}', "1700000000000")]
        await asyncio.sleep(0.05)
        assert (relay.hub._due, reads.named) == (set(), 0)


async def test_a_notices_entries_written_to_clients_are_one_relay_lag_sample(
    redis_url: str, relay: Relay
) -> None:
    """The hub writes a step's entries to the clients of parked followers from its callback, without
    waking their tasks, and tells the relay lag once for them all, with the step's `at`."""
    lags: list[str] = []
    hub = StreamHub(
        ServerNotices(connect_reader(redis_url, relay.keys.stream_reader_name), relay.keys),
        lags.append,
    )
    streams = [relay.keys.stream(uuid.uuid4().hex) for _ in range(3)]
    written: list[tuple[str, str, str]] = []

    def write(entry_id: str, kind: str, data: str) -> bool:
        written.append((entry_id, kind, data))
        return True

    try:
        with contextlib.ExitStack() as stack:
            subscriptions = [stack.enter_context(hub.subscribe(s, "2-1", 1 << 20)) for s in streams]
            await eventually(lambda: asyncio.sleep(0, not hub._due), "the new streams read", interval=0.01)
            for subscription in subscriptions:
                subscription.direct = write
            waits = [asyncio.create_task(subscription.wait(30)) for subscription in subscriptions]
            await asyncio.sleep(0)  # every follower parked
            hub._notice(
                LINE.join(
                    notice_line(s, "3-1", "delta", "1700000000000", f"[{n}]") for n, s in enumerate(streams)
                )
            )
            assert written == [("3-1", "delta", f"[{n}]") for n in range(len(streams))]
            assert lags == ["1700000000000"]
            await asyncio.sleep(0)
            assert not any(waiting.done() for waiting in waits)
            assert all(subscription.take() == [] for subscription in subscriptions)
            for waiting in waits:
                waiting.cancel()
    finally:
        await hub.close()


class ReadCount:
    """How many streams the hub's XREADs named, from now on."""

    def __init__(self, relay: Relay, monkeypatch: pytest.MonkeyPatch) -> None:
        self.named = 0
        read = relay.hub._source.read

        async def counted(due: Collection[Any], count: int) -> Any:
            self.named += len(due)
            return await read(due, count)

        monkeypatch.setattr(relay.hub._source, "read", counted)


@pytest.fixture
async def store(relay: Relay, redis_url: str) -> JobStore:
    """A job store that writes where the relay reads."""
    await relay.redis.script_load(scripts.STEP.source)  # a worker's publisher sends steps by EVALSHA
    return JobStore(relay.redis, relay.keys, make_settings(redis_url))


async def _started_jobs(store: JobStore, workers: list[str], each: int) -> dict[str, list[str]]:
    """`each` jobs running on every worker of `workers`: their ids by worker."""
    jobs: dict[str, list[str]] = {}
    for worker in workers:
        for _ in range(each):
            job_id = (await store.submit(JobRequest(prompt="Hi"), model=MODEL, max_queued=0)).job_id
            assert await store.start(job_id, worker, MODEL, lease_seconds=60) is not None
            jobs.setdefault(worker, []).append(job_id)
    return jobs


async def _step(store: JobStore, worker: str, steps: dict[str, list[Event]]) -> None:
    """One step call of `worker` for all of its jobs, as its publisher sends it."""
    command = transitions(store, maxlen=1000).step_command(
        worker_id=worker, steps=[JobStep(job_id, events) for job_id, events in steps.items()]
    )
    answers = await store.redis.execute_command(*command)
    assert answers == ["go"] * len(steps)


async def _followed(relay: Relay, job_ids: list[str]) -> list[asyncio.Task[list[str]]]:
    """A follower of each job from its start, once the hub has read every stream it was given."""
    followers = [asyncio.create_task(_follow_all(relay, job_id)) for job_id in job_ids]
    await _until_watched(relay, len(job_ids))
    await eventually(lambda: asyncio.sleep(0, not relay.hub._due), "the new streams read", interval=0.01)
    return followers


async def _stored(relay: Relay, job_id: str) -> list[str]:
    return [entry_id for entry_id, _ in await relay.redis.xrange(relay.keys.stream(job_id))]


def _delta(seq: int) -> DeltaEvent:
    return DeltaEvent(seq=seq, text=f" {seq}", token_ids=[seq])


def _done(seq: int) -> DoneEvent:
    return DoneEvent(seq=seq, finish_reason="length", usage=Usage(prompt_tokens=1, completion_tokens=seq))


async def test_steps_of_many_workers_reach_every_follower_once_and_in_order_with_no_read(
    store: JobStore, relay: Relay, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Four workers step their jobs at once, round after round: each step's notice carries its
    entries, and the hub hands them out without reading a stream."""
    monkeypatch.setattr("gateway.relay.hub.SWEEP_SECONDS", 60.0)
    jobs = await _started_jobs(store, [f"worker-{n}" for n in range(4)], each=10)
    every_job = [job_id for job_ids in jobs.values() for job_id in job_ids]
    followers = await _followed(relay, every_job)
    reads = ReadCount(relay, monkeypatch)
    rounds = 20
    for seq in range(FIRST_DELTA, FIRST_DELTA + rounds + 1):
        event = _delta(seq) if seq < FIRST_DELTA + rounds else _done(seq)
        steps = [_step(store, worker, dict.fromkeys(job_ids, [event])) for worker, job_ids in jobs.items()]
        await asyncio.gather(*steps)
    received = await asyncio.wait_for(asyncio.gather(*followers), 30)
    for job_id, ids in zip(every_job, received, strict=True):
        assert ids == await _stored(relay, job_id)
        assert len(ids) == FIRST_DELTA + rounds + 1
    assert reads.named == 0


async def test_steps_of_many_workers_reach_every_sse_client_of_a_gateway_once_and_in_order(
    gateway_process: KeyedGateway, redis_client: aioredis.Redis, redis_url: str
) -> None:
    """Through a gateway process, whose event streams take live entries from the hub's callback, written
    to each client's socket at once (`server_send.body_writer`): four workers step their jobs at once,
    round after round, while every job has a client."""
    await redis_client.script_load(scripts.STEP.source)
    store = JobStore(redis_client, gateway_process.keys, make_settings(redis_url))
    jobs = await _started_jobs(store, [f"worker-{n}" for n in range(4)], each=10)
    every_job = [job_id for job_ids in jobs.values() for job_id in job_ids]
    async with httpx.AsyncClient(base_url=gateway_process.base_url, timeout=60) as http:
        received: list[list[tuple[str, dict[str, Any]]]] = [[] for _ in every_job]
        readers = [
            asyncio.create_task(read_sse(http, job_id, into=into))
            for job_id, into in zip(every_job, received, strict=True)
        ]
        rounds = 20
        for seq in range(FIRST_DELTA, FIRST_DELTA + rounds + 1):
            event = _delta(seq) if seq < FIRST_DELTA + rounds else _done(seq)
            steps = [
                _step(store, worker, dict.fromkeys(job_ids, [event])) for worker, job_ids in jobs.items()
            ]
            await asyncio.gather(*steps)
            if seq == FIRST_DELTA:  # every client live before the other rounds
                await eventually(
                    lambda: asyncio.sleep(0, all(len(events) > FIRST_DELTA for events in received)),
                    "the first round read",
                )
        await asyncio.wait_for(asyncio.gather(*readers), 60)
    for job_id, events in zip(every_job, received, strict=True):
        assert [entry_id for entry_id, _ in events] == await _stored_in(redis_client, gateway_process, job_id)
        assert len(events) == FIRST_DELTA + rounds + 1


async def _stored_in(redis_client: aioredis.Redis, gateway: KeyedGateway, job_id: str) -> list[str]:
    return [entry_id for entry_id, _ in await redis_client.xrange(gateway.keys.stream(job_id))]


async def test_a_client_write_that_fails_in_the_hubs_callback_leaves_the_entries_to_its_follower(
    store: JobStore, relay: Relay, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A follower whose direct write raises (a stand-in: a client's transport failing under the hub's
    callback) still gets every entry, from its own task; the hub goes on for the other followers."""
    monkeypatch.setattr("gateway.relay.hub.SWEEP_SECONDS", 60.0)
    failing_job, other_job = (await _started_jobs(store, ["worker-1"], each=2))["worker-1"]
    failing = relay.follow(failing_job, START)
    attempts = 0

    def fail(entry_id: str, kind: str, data: str) -> bool:
        nonlocal attempts
        attempts += 1
        raise RuntimeError("the transport is closed")

    failing.write_now = fail

    async def follow_failing() -> list[str]:
        return [entry.id async for batch in failing.batches(IDLE_SECONDS) for entry in batch]

    followers = [asyncio.create_task(follow_failing()), asyncio.create_task(_follow_all(relay, other_job))]
    await _until_watched(relay, 2)
    await eventually(lambda: asyncio.sleep(0, not relay.hub._due), "the new streams read", interval=0.01)
    for seq in range(FIRST_DELTA, FIRST_DELTA + 3):
        event = _delta(seq) if seq < FIRST_DELTA + 2 else _done(seq)
        await _step(store, "worker-1", {failing_job: [event], other_job: [event]})
        await asyncio.sleep(0.05)  # each step handed over while the followers wait
    failed_ids, other_ids = await asyncio.wait_for(asyncio.gather(*followers), 30)
    assert failed_ids == await _stored(relay, failing_job)
    assert other_ids == await _stored(relay, other_job)
    assert attempts == 1  # not asked again


async def test_an_entry_after_one_the_hub_missed_has_its_stream_read_from_the_cursor(
    store: JobStore, relay: Relay, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("gateway.relay.hub.SWEEP_SECONDS", 60.0)
    (job_id,) = (await _started_jobs(store, ["worker-1"], each=1))["worker-1"]
    (follower,) = await _followed(relay, [job_id])
    reads = ReadCount(relay, monkeypatch)
    missed = _delta(FIRST_DELTA)
    await relay.redis.xadd(  # as a step whose notice was lost
        relay.keys.stream(job_id), {"type": "delta", "data": missed.model_dump_json()}, id=f"{missed.seq}-1"
    )
    await _step(store, "worker-1", {job_id: [_done(FIRST_DELTA + 1)]})
    assert await asyncio.wait_for(follower, 30) == await _stored(relay, job_id)
    assert reads.named == 1  # the one stream, once


async def test_a_notice_heard_twice_hands_its_entries_out_once(store: JobStore, relay: Relay) -> None:
    """The hub may hear an entry from a notice and from a read (a read in flight, a sweep): each
    entry reaches a follower once, whichever comes first."""
    (job_id,) = (await _started_jobs(store, ["worker-1"], each=1))["worker-1"]
    (follower,) = await _followed(relay, [job_id])
    async with relay.redis.pubsub(ignore_subscribe_messages=True) as pubsub:
        await pubsub.subscribe(relay.keys.notices_of(job_id))
        await _step(store, "worker-1", {job_id: [_delta(FIRST_DELTA), _delta(FIRST_DELTA + 1)]})
        heard = await eventually(lambda: pubsub.get_message(timeout=1), "the step's notice")
    await relay.redis.publish(relay.keys.notices_of(job_id), heard["data"])
    await notify(relay.redis, relay.keys, relay.keys.stream(job_id))  # and its stream read too
    await _step(store, "worker-1", {job_id: [_done(FIRST_DELTA + 2)]})
    assert await asyncio.wait_for(follower, 30) == await _stored(relay, job_id)


async def _started_in(store: JobStore, partition: int, worker: str = "worker-1") -> str:
    """A job running on `worker`, its id in the notice partition `partition`."""
    job_id = store.keys.job_id_in(partition)
    await store.submit(JobRequest(prompt="Hi"), model=MODEL, max_queued=0, job_id=job_id)
    assert await store.start(job_id, worker, MODEL, lease_seconds=60) is not None
    return job_id


async def _listened(redis_client: aioredis.Redis, relay: Relay) -> dict[int, int]:
    """The notice partitions whose channels have listeners, and how many each (`PUBSUB NUMSUB`)."""
    channels = [relay.keys.notice_channel(n) for n in range(relay.keys.notice_partitions)]
    answer = await redis_client.pubsub_numsub(*channels)
    return {partition: listeners for partition, (_, listeners) in enumerate(answer) if listeners}


async def test_a_step_tells_each_notice_partition_of_its_own_streams_only(
    store: JobStore, relay: Relay
) -> None:
    first, second = await _started_in(store, 1), await _started_in(store, 2)
    channels = {store.keys.notice_channel(1): first, store.keys.notice_channel(2): second}
    async with relay.redis.pubsub(ignore_subscribe_messages=True) as pubsub:
        await pubsub.subscribe(*channels)
        await _step(store, "worker-1", {first: [_delta(FIRST_DELTA)], second: [_delta(FIRST_DELTA)]})
        heard = [await eventually(lambda: pubsub.get_message(timeout=1), "a notice") for _ in channels]
    for message in heard:
        streams = {line.partition("\x1f")[0] for line in message["data"].split(LINE)}
        assert streams == {store.keys.stream(channels[message["channel"]])}
    assert {message["channel"] for message in heard} == set(channels)


async def test_the_hub_hears_only_the_partitions_of_the_streams_it_watches(
    store: JobStore, relay: Relay, redis_client: aioredis.Redis
) -> None:
    async def listened_to(partitions: set[int]) -> None:
        async def listened() -> bool:
            return await _listened(redis_client, relay) == dict.fromkeys(partitions, 1)

        await eventually(listened, f"the hub listens to the partitions {partitions} only")

    first = await _started_in(store, 1)
    (first_follower,) = await _followed(relay, [first])
    await listened_to({1})
    second = await _started_in(store, 2)
    (second_follower,) = await _followed(relay, [second])
    await listened_to({1, 2})
    await _step(store, "worker-1", {first: [_done(FIRST_DELTA)]})
    assert await asyncio.wait_for(first_follower, 30) == await _stored(relay, first)
    await listened_to({2})
    await _step(store, "worker-1", {second: [_delta(FIRST_DELTA), _done(FIRST_DELTA + 1)]})
    assert await asyncio.wait_for(second_follower, 30) == await _stored(relay, second)


async def test_a_stream_of_a_partition_not_heard_yet_misses_nothing_appended_before_its_subscription_holds(
    store: JobStore, relay: Relay, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The subscription to a partition's channel is held back (a test double around the source's
    change of subscriptions: the window between a stream's first read and its partition's
    subscription lasts a round trip, too short to append in otherwise); steps appended meanwhile,
    their notices gone unheard, reach the follower once its subscription holds, by the read that
    follows it, not by a sweep."""
    monkeypatch.setattr("gateway.relay.hub.SWEEP_SECONDS", 60.0)
    source = relay.hub._source
    assert isinstance(source, ServerNotices)
    held, resubscribe = asyncio.Event(), source._resubscribe

    async def held_back(pubsub: Any) -> None:
        await held.wait()
        await resubscribe(pubsub)

    monkeypatch.setattr(source, "_resubscribe", held_back)
    job_id = await _started_in(store, 3)
    (follower,) = await _followed(relay, [job_id])
    await _step(store, "worker-1", {job_id: [_delta(FIRST_DELTA)]})
    await _step(store, "worker-1", {job_id: [_delta(FIRST_DELTA + 1)]})
    assert not follower.done()
    held.set()
    watched = relay.hub._watched[store.keys.stream(job_id)]
    last = f"{FIRST_DELTA + 1}-1"
    await eventually(lambda: asyncio.sleep(0, watched.cursor == last), "the steps read", timeout=10)
    await _step(store, "worker-1", {job_id: [_done(FIRST_DELTA + 2)]})
    assert await asyncio.wait_for(follower, 30) == await _stored(relay, job_id)
