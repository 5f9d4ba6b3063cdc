"""A process's command connections to Redis: bounded however many commands run at once."""

from __future__ import annotations

import asyncio
import uuid

import pytest
import redis.asyncio as aioredis
from redis.asyncio.connection import Connection
from redis.exceptions import DataError

from shared.errors import BackendUnavailable
from shared.redis_client import FailoverConnection, connect, redis_errors
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
        holding = asyncio.create_task(client.blpop([f"{name}:empty"], timeout=0))  # until a push

        async def blocked() -> bool:  # the BLPOP has the one connection
            clients = await redis_client.client_list()
            return any(entry["name"] == name and entry["cmd"] == "blpop" for entry in clients)

        await eventually(blocked, "the BLPOP blocks")
        with pytest.raises(BackendUnavailable, match="No connection available"):
            with redis_errors():
                await client.ping()
        await redis_client.rpush(f"{name}:empty", "free")
        assert await holding == (f"{name}:empty", "free")
        assert await client.ping() is True  # the connection is back in the pool once the BLPOP answers
    finally:
        await client.aclose()


def test_commands_are_packed_in_c_to_the_same_bytes_as_redis_pys_own_packing() -> None:
    """`PackedInC` against redis-py's Python packing, on what the lifecycle sends: text of any kind,
    bytes, numbers, a subcommand in the command's name, and an argument past redis-py's buffer cutoff."""
    fast, python = FailoverConnection(), Connection()
    commands = [
        ("EVALSHA", "a" * 40, 2, "k:1", "k:2", "é 😀 \x00", b"\xff\x00", -3, 0.1, 1e20, "x" * 20_000),
        ("CONFIG GET", "maxmemory"),
        (b"CLIENT SETNAME", "worker"),
    ]
    for command in commands:
        assert b"".join(fast.pack_command(*command)) == b"".join(python.pack_command(*command))
    assert b"".join(fast.pack_commands(commands)) == b"".join(python.pack_commands(commands))
    for refused in (True, None):
        with pytest.raises(DataError):
            fast.pack_command("SET", "k", refused)


async def test_a_client_packing_in_c_round_trips_what_it_sends(redis_url: str) -> None:
    client = connect(redis_url, "test-packed-in-c", 2)
    key = f"test-packed-in-c:{uuid.uuid4().hex}"
    try:
        await client.set(key, "é 😀 \x00 " + "x" * 10_000, ex=60)
        assert await client.get(key) == "é 😀 \x00 " + "x" * 10_000
    finally:
        await client.delete(key)
        await client.aclose()
