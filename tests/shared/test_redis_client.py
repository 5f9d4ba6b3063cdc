"""A process's command connections to Redis: bounded however many commands run at once."""

from __future__ import annotations

import asyncio
import uuid

import pytest
import redis.asyncio as aioredis

from shared.errors import BackendUnavailable
from shared.redis_client import connect, redis_errors
from tests.helpers import eventually


async def test_a_burst_of_commands_shares_the_pool_instead_of_opening_one_each(redis_url: str) -> None:
    name = f"sptest-pool-{uuid.uuid4().hex[:8]}"
    client = connect(redis_url, name, max_connections=2)
    try:
        # Each BLPOP holds its connection for its whole timeout: six at once would open six.
        answers = await asyncio.gather(*(client.blpop([f"{name}:empty"], timeout=0.2) for _ in range(6)))
        assert answers == [None] * 6
        named = [entry["name"] for entry in await client.client_list()]
        assert named.count(name) == 2
    finally:
        await client.aclose()


async def test_a_command_that_finds_no_free_connection_in_time_fails_as_redis_unreachable(
    redis_url: str, redis_client: aioredis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("shared.redis_client.POOL_WAIT_SECONDS", 0.2)
    name = f"sptest-pool-{uuid.uuid4().hex[:8]}"
    client = connect(redis_url, name, max_connections=1)
    try:
        holding = asyncio.create_task(client.blpop([f"{name}:empty"], timeout=2))

        async def blocked() -> bool:  # the BLPOP has the one connection
            clients = await redis_client.client_list()
            return any(entry["name"] == name and entry["cmd"] == "blpop" for entry in clients)

        await eventually(blocked, "the BLPOP blocks")
        with pytest.raises(BackendUnavailable, match="No connection available"):
            with redis_errors():
                await client.ping()
        assert await holding is None
        assert await client.ping() is True  # the connection is back in the pool once the BLPOP answers
    finally:
        await client.aclose()
