"""A Redis that answers but refuses: out of memory, read-only, or any other refusal is a 503, never a 500.

Each test runs an in-process gateway on a private redis-server that it drives into the refusal:
`maxmemory` of one byte with `noeviction` refuses every write with OOM, and `REPLICAOF` another
server makes it a read-only replica, as a master demoted by a failover is.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import httpx
import pytest
import redis.asyncio as aioredis

from shared.errors import BackendUnavailable
from shared.keys import Keys
from shared.redis_client import redis_errors
from tests.conftest import make_settings
from tests.helpers import eventually, in_process_gateway, submit
from tests.processes import Processes, free_port

JOB = {"prompt": "a full Redis", "max_tokens": 4}


@pytest.fixture(scope="module")
def processes(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Processes]:
    processes = Processes(tmp_path_factory.mktemp("redis-refusals"))
    yield processes
    processes.stop_all()


def _start_redis(processes: Processes, name: str, folder: Path) -> str:
    return processes.start_redis(name, free_port(), folder / name, "--appendonly", "no")


@pytest.fixture
def private_redis(processes: Processes, tmp_path: Path) -> str:
    return _start_redis(processes, f"redis-{tmp_path.name}", tmp_path)


@pytest.fixture
async def admin(private_redis: str) -> AsyncIterator[aioredis.Redis]:
    client = aioredis.Redis.from_url(private_redis, decode_responses=True)
    yield client
    await client.aclose()


@pytest.fixture
async def gateway(private_redis: str) -> AsyncIterator[httpx.AsyncClient]:
    async with in_process_gateway(make_settings(private_redis, allow_unauthenticated=True)) as http:
        yield http


def _assert_unavailable(answer: httpx.Response, because: str) -> None:
    assert answer.status_code == 503, answer.text
    assert answer.headers["Retry-After"] == "1"
    body = answer.json()
    assert body["error_type"] == "unavailable"
    assert because in body["error"], body


async def test_a_redis_out_of_memory_answers_503_and_still_serves_reads(
    gateway: httpx.AsyncClient, admin: aioredis.Redis
) -> None:
    job_id = await submit(gateway, **JOB)
    await admin.config_set("maxmemory-policy", "noeviction")
    await admin.config_set("maxmemory", 1)  # every byte Redis holds is past it: every write is refused
    _assert_unavailable(await gateway.post("/v1/jobs", json=JOB), "out of memory")
    _assert_unavailable(await gateway.post(f"/v1/jobs/{job_id}/cancel"), "out of memory")
    record = await gateway.get(f"/v1/jobs/{job_id}")
    assert record.status_code == 200 and record.json()["status"] == "queued"
    page = await gateway.get(f"/v1/jobs/{job_id}/events")
    assert page.status_code == 200 and page.json()["events"][0]["type"] == "status"
    await admin.config_set("maxmemory", 0)
    await submit(gateway, **JOB)  # once Redis has room, writes go through again


async def test_a_redis_demoted_to_a_replica_answers_503(
    gateway: httpx.AsyncClient, admin: aioredis.Redis, processes: Processes, tmp_path: Path
) -> None:
    await submit(gateway, **JOB)
    master = _start_redis(processes, f"master-{tmp_path.name}", tmp_path)
    port = int(master.rsplit(":", 1)[1].split("/")[0])
    await admin.replicaof("127.0.0.1", port)

    async def is_replica() -> bool:
        return (await admin.info("replication"))["role"] == "slave"

    await eventually(is_replica, "the server is a replica")
    _assert_unavailable(await gateway.post("/v1/jobs", json=JOB), "read-only")
    await admin.replicaof("NO", "ONE")
    await submit(gateway, **JOB)  # promoted again, it takes writes


async def test_any_other_refusal_of_redis_is_backend_unavailable(admin: aioredis.Redis) -> None:
    keys = Keys("sptest-refusal")
    await admin.xadd(keys.stream("a" * 32), {"type": "status", "data": "{}"})
    with pytest.raises(BackendUnavailable, match="Redis refused the command: WRONGTYPE"):
        with redis_errors():
            await admin.hget(keys.stream("a" * 32), "status")  # type: ignore[misc]
