"""The gateway's one stream reader against the real Redis: fan-out, wake-up, slow followers."""

from __future__ import annotations

import asyncio
import uuid

import pytest
import redis.asyncio as aioredis

from gateway import fanout
from gateway.entries import Entry
from gateway.fanout import Subscription
from gateway.relay import START, Relay, StreamLimits
from shared.config import GatewaySettings
from shared.events import JobState
from shared.keys import ANONYMOUS_OWNER
from tests.helpers import eventually

LIMITS = StreamLimits.of(GatewaySettings())


async def _append(redis_client: aioredis.Redis, relay: Relay, job_id: str, kind: str = "delta") -> str:
    entry_id: str = await redis_client.xadd(relay.keys.stream(job_id), {"type": kind, "data": "{}"})
    return entry_id


async def _blocked_readers(redis_client: aioredis.Redis, relay: Relay) -> int:
    """Connections of this relay's gateway blocked in XREAD."""
    return sum(
        1
        for client in await redis_client.client_list()
        if client.get("cmd") == "xread" and client.get("name") == relay.keys.stream_reader_name
    )


async def _until_watched(relay: Relay, streams: int) -> None:
    async def watched() -> bool:
        return relay.hub.streams >= streams

    await eventually(watched, f"the hub watches {streams} streams", interval=0.01)


async def _follow_all(relay: Relay, job_id: str, cursor: str = START) -> list[str]:
    return [entry.id async for entry in relay.follow(job_id, cursor)]


async def test_many_followers_share_one_blocking_reader(redis_client: aioredis.Redis, relay: Relay) -> None:
    jobs = [uuid.uuid4().hex for _ in range(50)]
    for job_id in jobs:
        await _append(redis_client, relay, job_id, "status")
    followers = [asyncio.create_task(_follow_all(relay, job_id)) for job_id in jobs]
    await _until_watched(relay, len(jobs))
    assert await _blocked_readers(redis_client, relay) == 1  # one XREAD for 50 open streams
    ends = {job_id: await _append(redis_client, relay, job_id, "done") for job_id in jobs}
    results = await asyncio.gather(*followers)
    assert [ids[-1] for ids in results] == [ends[job_id] for job_id in jobs]
    assert all(len(ids) == 2 for ids in results)


async def test_a_stream_added_while_the_reader_blocks_is_watched_at_once(
    redis_client: aioredis.Redis, relay: Relay, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(fanout, "HUB_BLOCK_MS", 60_000)  # without the wake-up, B would wait a minute
    first, second = uuid.uuid4().hex, uuid.uuid4().hex
    await _append(redis_client, relay, first, "status")
    following_first = asyncio.create_task(_follow_all(relay, first))
    await eventually(lambda: _blocked_readers(redis_client, relay), "the reader blocks", interval=0.01)
    await _append(redis_client, relay, second, "status")
    following_second = asyncio.create_task(_follow_all(relay, second))
    await _until_watched(relay, 2)
    end = await _append(redis_client, relay, second, "done")
    assert (await asyncio.wait_for(following_second, 30))[-1] == end
    await _append(redis_client, relay, first, "done")
    assert len(await asyncio.wait_for(following_first, 30)) == 2


async def test_a_follower_that_falls_behind_catches_up_without_gap_or_duplicate(
    redis_client: aioredis.Redis, relay: Relay, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(fanout, "SUBSCRIBER_BUFFER", 4)
    job_id = uuid.uuid4().hex
    await _append(redis_client, relay, job_id, "status")
    follower = aiter(relay.follow(job_id, START))
    received = [(await anext(follower)).id]
    reading = asyncio.create_task(anext(follower))  # catches up, subscribes, waits for more
    await _until_watched(relay, 1)
    for _ in range(40):
        await _append(redis_client, relay, job_id)
    await _append(redis_client, relay, job_id, "done")

    async def dropped() -> bool:  # the hub drops it once its mailbox overflows
        return relay.hub.streams == 0

    await eventually(dropped, "the hub drops the lagging follower", interval=0.01)
    received.append((await reading).id)
    received += [entry.id async for entry in follower]
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
        await pool.hset(polling.keys.job(job_id), "status", "running")
    try:
        pages = [
            asyncio.create_task(polling.page(job_id, cursor, 10, 30, ANONYMOUS_OWNER, LIMITS))
            for job_id, cursor in zip(jobs, cursors, strict=True)
        ]
        await asyncio.wait_for(_until_watched(polling, len(jobs)), 10)
        ours = (pool_name, polling.keys.stream_reader_name)

        async def blocked() -> list[str]:
            return [c["name"] for c in await pool.client_list() if "b" in c["flags"] and c["name"] in ours]

        # The reader is between two blocking reads now and then: the first look that finds it in one
        # must find it alone there (a poll blocking on the pool would be blocked all along).
        reader_blocked = await eventually(
            blocked, "the hub's reader blocks", until=lambda names: polling.keys.stream_reader_name in names
        )
        assert reader_blocked == [polling.keys.stream_reader_name]
        ends = [await _append(pool, polling, job_id, "done") for job_id in jobs]
        answers = await asyncio.wait_for(asyncio.gather(*pages), 30)
        assert [[entry.id for entry in entries] for entries, _, _ in answers] == [[end] for end in ends]
        assert all(done for _, _, done in answers)
    finally:
        await pool.aclose()


async def test_a_long_poll_with_nothing_new_answers_empty_once_its_wait_is_over(relay: Relay) -> None:
    job_id = uuid.uuid4().hex
    cursor = await _append(relay.redis, relay, job_id, "status")
    await relay.redis.hset(relay.keys.job(job_id), "status", "running")
    loop = asyncio.get_running_loop()
    began = loop.time()
    entries, state, done = await relay.page(job_id, cursor, 10, 0.3, ANONYMOUS_OWNER, LIMITS)
    assert loop.time() - began >= 0.3
    assert (entries, state, done) == ([], JobState.running, False)
    assert relay.hub.streams == 0  # the poll's subscription ended with it
