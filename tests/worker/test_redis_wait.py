"""A starting worker's wait for Redis, against a private redis-server started late: the first writes
are tried again with a backoff until Redis takes them, the wait is said once when it begins and once
when it ends, it gives up only past its timeout, and a stop ends it at once."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import redis.asyncio as aioredis

from shared.errors import BackendUnavailable
from shared.redis_client import connect, redis_errors
from tests.helpers import eventually
from tests.processes import Processes, free_port
from worker.redis_wait import FIRST_RETRY_SECONDS, RedisWait

WAITING = "waiting for Redis before taking jobs"
ANSWERS = "Redis answers; the worker goes on starting"


class Tries:
    """A start-up write to a Redis that may not be running yet, and when each try of it began."""

    def __init__(self, client: aioredis.Redis) -> None:
        self.client = client
        self.at: list[float] = []

    async def __call__(self) -> None:
        self.at.append(asyncio.get_running_loop().time())
        with redis_errors():
            await self.client.set("registered", "yes")


@pytest.fixture
async def port() -> int:
    return free_port()


@pytest.fixture
async def tries(port: int) -> AsyncIterator[Tries]:
    client = connect(f"redis://127.0.0.1:{port}/0", "test-redis-wait", 1)
    try:
        yield Tries(client)
    finally:
        await client.aclose()


async def tried(tries: Tries, times: int) -> None:
    what = f"{times} tries"
    await eventually(lambda: asyncio.sleep(0, len(tries.at)), what, 10, 0.01, until=lambda n: n >= times)


async def test_the_wait_backs_off_says_so_once_and_goes_on_once_redis_started_late_takes_the_write(
    tries: Tries, port: int, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="worker.redis_wait")
    wait = RedisWait(timeout_seconds=0)
    waiting = asyncio.create_task(wait.run(tries))
    await tried(tries, 6)  # 1.55 s in
    assert wait.waiting
    assert not waiting.done()
    gaps = [later - earlier for earlier, later in zip(tries.at, tries.at[1:], strict=False)]
    for number, gap in enumerate(gaps[:5]):  # 0.05 s, doubled each time
        assert FIRST_RETRY_SECONDS * 2**number <= gap < FIRST_RETRY_SECONDS * 2 ** (number + 1) + 0.5, gaps

    processes = Processes(tmp_path)
    try:
        url = await asyncio.to_thread(processes.start_redis, "redis", port, tmp_path / "redis-data")
        await asyncio.wait_for(waiting, 10)  # the next try, at most 2 s after Redis answers
        assert not wait.waiting
        late = aioredis.Redis.from_url(url)
        assert await late.get("registered") == b"yes"
        await late.aclose()
    finally:
        await asyncio.to_thread(processes.stop_all)
    said = [record.getMessage() for record in caplog.records]
    assert sum(WAITING in message for message in said) == 1, said
    assert sum(ANSWERS in message for message in said) == 1, said
    assert "Redis is unreachable" in next(message for message in said if WAITING in message)


async def test_the_wait_goes_on_once_sentinels_started_late_name_the_master(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="worker.redis_wait")
    master_port, sentinel_port = free_port(), free_port()
    client = connect(f"redis+sentinel://127.0.0.1:{sentinel_port}/late", "test-redis-wait", 1)
    tries = Tries(client)
    waiting = asyncio.create_task(RedisWait(timeout_seconds=0).run(tries))
    processes = Processes(tmp_path)
    try:
        await tried(tries, 3)
        url = await asyncio.to_thread(processes.start_redis, "redis", master_port, tmp_path / "redis-data")
        await asyncio.to_thread(
            processes.start_sentinel, "sentinel", sentinel_port, tmp_path, "late", master_port
        )
        await asyncio.wait_for(waiting, 10)
        master = aioredis.Redis.from_url(url)
        assert await master.get("registered") == b"yes"
        await master.aclose()
    finally:
        await client.aclose()
        await asyncio.to_thread(processes.stop_all)
    said = [record.getMessage() for record in caplog.records]
    assert sum(WAITING in message for message in said) == 1, said
    assert "Redis is unreachable" in next(message for message in said if WAITING in message)


async def test_the_wait_gives_up_past_its_timeout_naming_the_setting(tries: Tries) -> None:
    loop = asyncio.get_running_loop()
    began = loop.time()
    with pytest.raises(BackendUnavailable, match="redis_startup_timeout_seconds") as raised:
        await RedisWait(timeout_seconds=0.5).run(tries)
    assert loop.time() - began >= 0.5
    # At the first try past its timeout, which ran out before the try ahead of it: the timeout counts
    # from the first try, and a loaded machine only makes the tries later.
    assert tries.at[-1] >= began + 0.5 and tries.at[-2] < tries.at[0] + 0.5
    assert raised.value.message.startswith("Redis is unreachable")


async def test_a_stop_ends_the_wait_at_once(tries: Tries, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("worker.redis_wait.FIRST_RETRY_SECONDS", 3600.0)
    wait = RedisWait(timeout_seconds=0)
    waiting = asyncio.create_task(wait.run(tries))
    await tried(tries, 1)  # then waiting an hour for the next
    waiting.cancel()
    with pytest.raises(asyncio.CancelledError):  # not TimeoutError: the stop did not wait the hour out
        await asyncio.wait_for(waiting, 30)
    assert len(tries.at) == 1
