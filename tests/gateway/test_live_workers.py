"""The live workers are read in O(workers): `/health`, which anyone may call, costs Redis a few
commands a second however many keys the database holds, and a worker that stops beating drops out
once its heartbeat's TTL passes.

On a private redis-server, because INFO commandstats counts the whole server's commands; the
database also holds many keys of another application, which a scan of the keyspace would walk.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import redis.asyncio as aioredis

from shared.config import Settings
from shared.keys import Keys
from shared.workers import live_workers, withdraw
from tests.conftest import make_settings
from tests.gateway.stand_ins import heartbeat, private_redis
from tests.helpers import eventually, in_process_gateway

UNRELATED_KEYS = 50_000
HEALTH_CALLS = 50
MODEL = "served-model"
# A read of the live workers is ZRANGE and MGET (and ZREM once a heartbeat has expired); the
# gateway reads at most once a second, and a burst of calls may straddle two seconds.
READ_COMMANDS = 3
READS_IN_A_BURST = 2


@dataclass
class Crowded:
    """A private Redis that holds UNRELATED_KEYS keys of another application: settings on it, a client."""

    settings: Settings
    client: aioredis.Redis

    @property
    def keys(self) -> Keys:
        return Keys.of(self.settings)


@pytest.fixture
async def crowded(tmp_path: Path) -> AsyncIterator[Crowded]:
    with private_redis(tmp_path) as url:
        client = aioredis.Redis.from_url(url, decode_responses=True)
        async with client.pipeline(transaction=False) as pipe:
            for start in range(0, UNRELATED_KEYS, 1000):
                pipe.mset({f"another-app:{n}": "x" for n in range(start, start + 1000)})
            await pipe.execute()
        yield Crowded(make_settings(url, allow_unauthenticated=True), client)
        await client.aclose()


async def _calls(client: aioredis.Redis) -> dict[str, int]:
    """Commands run since the last CONFIG RESETSTAT, by name, leaving out the test's own."""
    stats = await client.info("commandstats")
    calls = {name.removeprefix("cmdstat_"): int(fields["calls"]) for name, fields in stats.items()}
    return {name: count for name, count in calls.items() if name not in ("config|resetstat", "info")}


async def test_health_costs_redis_a_few_commands_however_many_keys_it_holds(crowded: Crowded) -> None:
    client, keys = crowded.client, crowded.keys
    await heartbeat(client, keys, "worker-1", MODEL)
    async with in_process_gateway(crowded.settings) as http:
        await http.get("/health")  # the gateway's connection is made (CLIENT SETNAME) before counting
        await client.config_resetstat()
        answers = [await http.get("/health") for _ in range(HEALTH_CALLS)]
        calls = await _calls(client)
    assert {answer.status_code for answer in answers} == {200}
    assert answers[-1].json()["workers"] == 1
    assert "scan" not in calls, calls
    assert sum(calls.values()) <= READ_COMMANDS * READS_IN_A_BURST, calls

    # One read on its own, whatever the database holds.
    await client.config_resetstat()
    assert [info.worker_id for info in await live_workers(client, keys)] == ["worker-1"]
    calls = await _calls(client)
    assert "scan" not in calls and sum(calls.values()) <= READ_COMMANDS, calls


async def test_a_worker_that_stops_beating_drops_out_after_its_ttl(crowded: Crowded) -> None:
    client, keys = crowded.client, crowded.keys
    for worker_id in ("stays", "stops", "leaves"):
        await heartbeat(client, keys, worker_id, MODEL)
    async with in_process_gateway(crowded.settings) as http:
        assert (await http.get("/health")).json()["workers"] == 3
        # Its last beat, with a short TTL only now: a busy machine may take longer to start the gateway.
        await heartbeat(client, keys, "stops", MODEL, ttl_ms=500)
        await withdraw(client, keys, "leaves")  # a worker that shuts down says so at once

        async def counted() -> int:
            workers: int = (await http.get("/health")).json()["workers"]
            return workers

        await eventually(
            counted, "/health counts the one worker that still beats", 10, until=lambda n: n == 1
        )
    assert [info.worker_id for info in await live_workers(client, keys)] == ["stays"]
    assert await client.zrange(keys.workers, 0, -1) == ["stays"]  # the index keeps no one who left
