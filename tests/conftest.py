"""Shared fixtures: a real Redis, and one running system (a gateway and two real workers) per session.

The workers run the real vLLM engine with the default model, as separate processes
started by the `streampool` command, exactly as a deployment runs them. Every
session writes under its own key prefix, so it never sees another's keys.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO

import httpx
import pytest
import redis
import redis.asyncio as aioredis

from shared.config import Settings
from shared.jobstore import JobStore
from shared.keys import Keys
from shared.launcher import child_environment, wait_healthy

ROOT = Path(__file__).resolve().parent.parent
SYSTEM_START_TIMEOUT = 240
WORKERS = 2


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _answers(url: str) -> bool:
    try:
        return bool(redis.Redis.from_url(url, socket_connect_timeout=1).ping())
    except redis.RedisError:
        return False


@pytest.fixture(scope="session")
def redis_url() -> Iterator[str]:
    """The Redis at STREAMPOOL_REDIS_URL (or the default); a private redis-server when none answers."""
    url = os.environ.get("STREAMPOOL_REDIS_URL", "redis://127.0.0.1:6379/0")
    if _answers(url):
        yield url
        return
    server = shutil.which("redis-server")
    assert server, "no Redis answers and redis-server is not installed (apt-get install redis-server)"
    port = free_port()
    process = subprocess.Popen(
        [server, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"],
        stdout=subprocess.DEVNULL,
    )
    url = f"redis://127.0.0.1:{port}/0"
    for _ in range(100):
        if _answers(url):
            break
        time.sleep(0.1)
    yield url
    process.terminate()
    process.wait()


def make_settings(redis_url: str, **overrides: object) -> Settings:
    values: dict[str, object] = {
        "redis_url": redis_url,
        "key_prefix": f"sptest-{uuid.uuid4().hex[:8]}",
        "heartbeat_seconds": 0.5,
        "heartbeat_ttl_seconds": 3.0,
        "log_level": "INFO",
    }
    values.update(overrides)
    return Settings(**values)  # type: ignore[arg-type]


def delete_prefix(url: str, prefix: str) -> None:
    client = redis.Redis.from_url(url)
    names = list(client.scan_iter(match=f"{prefix}:*", count=1000))
    if names:
        client.delete(*names)


@dataclass
class System:
    """A running gateway and workers, and the settings they share."""

    settings: Settings
    base_url: str
    gateway: subprocess.Popen[bytes]
    workers: list[subprocess.Popen[bytes]]
    log_dir: Path

    @property
    def keys(self) -> Keys:
        return Keys(self.settings.key_prefix)


@pytest.fixture(scope="session")
def system(redis_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[System]:
    """A gateway and two workers, started once for the whole run, as `streampool` processes."""
    settings = make_settings(redis_url, port=free_port(), host="127.0.0.1")
    env = child_environment(settings)
    logs = tmp_path_factory.mktemp("system-logs")
    command = [sys.executable, "-m", "shared.cli"]

    log_files: list[IO[bytes]] = []

    def start(name: str) -> subprocess.Popen[bytes]:
        log_files.append(open(logs / f"{name}.log", "wb"))  # noqa: SIM115 - closed at teardown
        return subprocess.Popen(
            [*command, name.split("-")[0]], env=env, cwd=ROOT, stdout=log_files[-1], stderr=subprocess.STDOUT
        )

    gateway = start("gateway")
    workers = [start(f"worker-{n}") for n in range(WORKERS)]
    base_url = f"http://127.0.0.1:{settings.port}"
    try:
        if not wait_healthy(base_url, [gateway, *workers], WORKERS, SYSTEM_START_TIMEOUT):
            raise RuntimeError(f"the system did not become healthy; logs in {logs}")
        yield System(settings, base_url, gateway, workers, logs)
    finally:
        for process in [gateway, *workers]:
            process.terminate()
        for process in [gateway, *workers]:
            try:
                process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                process.kill()
        for log in log_files:
            log.close()
        delete_prefix(redis_url, settings.key_prefix)


@pytest.fixture
async def client(system: System) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=system.base_url, timeout=120) as http:
        yield http


@pytest.fixture
async def redis_client(redis_url: str) -> AsyncIterator[aioredis.Redis]:
    client = aioredis.Redis.from_url(redis_url, decode_responses=True)
    yield client
    await client.aclose()


UNIT_RETENTION_SECONDS = 60


async def delete_test_keys(client: aioredis.Redis, keys: Keys) -> None:
    """Every key under a test's prefix, and the arq job keys (arq's own prefix) of its jobs."""
    names = [name async for name in client.scan_iter(match=f"{keys.prefix}:*", count=1000)]
    job_ids = {name.split(":")[2] for name in names if name.startswith(f"{keys.prefix}:job:")}
    names += [keys.arq_job(job_id) for job_id in job_ids]
    if names:
        await client.delete(*names)


@pytest.fixture
async def store_factory(
    redis_client: aioredis.Redis, redis_url: str
) -> AsyncIterator[Callable[..., JobStore]]:
    """Job stores on the real Redis, each under a fresh prefix that is deleted afterwards."""
    made: list[JobStore] = []

    def make(**overrides: object) -> JobStore:
        settings = make_settings(redis_url, retention_seconds=UNIT_RETENTION_SECONDS, **overrides)
        made.append(JobStore(redis_client, Keys(settings.key_prefix), settings))
        return made[-1]

    yield make
    for store in made:
        await delete_test_keys(redis_client, store.keys)


@pytest.fixture
def store(store_factory: Callable[..., JobStore]) -> JobStore:
    return store_factory()
