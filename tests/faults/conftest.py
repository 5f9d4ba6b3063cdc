"""Pools for fault tests: a gateway and two workers with short leases and drain time, shared by this
package's tests, which kill, stop, freeze and replace individual workers.

Workers are `streampool worker` processes, as in tests/conftest.py's `system`; that pool is not used
here, since these tests take workers away. `pool` (tests/conftest.py, made by `run_pool`) runs the
real engine, for the tests whose subject is the engine (its core dying under jobs); `synthetic_pool`
the synthetic one, for those whose subject is the lease and the queue (a worker killed, frozen or
stopped, its jobs taken over by another), where each replaced worker starts in a second instead of a
minute.
"""

from __future__ import annotations

import signal
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from subprocess import Popen
from typing import Any

import httpx
import pytest
import redis

from cli.launcher import wait_healthy
from shared.config import Settings
from shared.keys import Keys
from shared.workers import WorkerInfo
from tests.conftest import SYSTEM_START_TIMEOUT, System, make_settings
from tests.helpers import deltas, eventually_sync, wait_until
from tests.processes import Processes, free_port
from tests.redis_cleanup import delete_prefix

# Short enough that a takeover happens within seconds, long enough for heartbeats every 0.5 s.
RECOVERY = {"lease_seconds": 2.0, "max_attempts": 2, "drain_seconds": 1.0}
WORKERS = 2
WAIT_TIMEOUT = 120
AOF = ("--appendonly", "yes")


@dataclass
class Pool:
    """The gateway and workers of the fault tests; workers come and go, by name."""

    settings: Settings
    base_url: str
    processes: Processes
    workers: dict[str, Popen[bytes]] = field(default_factory=dict)

    @property
    def keys(self) -> Keys:
        return Keys.of(self.settings)

    def live_workers(self) -> dict[str, Popen[bytes]]:
        return {name: process for name, process in self.workers.items() if process.poll() is None}

    def heartbeats(self) -> list[WorkerInfo]:
        client = redis.Redis.from_url(self.settings.redis_url, decode_responses=True)
        try:
            names = list(client.scan_iter(match=self.keys.worker_pattern, count=1000))
            values = client.mget(names) if names else []
        finally:
            client.close()
        return [WorkerInfo.model_validate_json(value) for value in values if value is not None]

    def ensure_workers(self, count: int = WORKERS) -> None:
        """Start workers until `count` live, and wait until exactly those have a heartbeat."""
        for _ in range(count - len(self.live_workers())):
            name = f"worker-{len(self.workers)}"
            settings = self.settings.model_copy(update={"metrics_port": free_port()})  # one port each
            self.workers[name] = self.processes.start(name, "worker", settings)

        def started() -> bool:
            live = self.live_workers()
            assert len(live) == count, f"a worker exited; logs in {self.processes.log_dir}"
            return {info.pid for info in self.heartbeats()} == {process.pid for process in live.values()}

        what = f"workers started; logs in {self.processes.log_dir}"
        eventually_sync(started, what, SYSTEM_START_TIMEOUT, interval=0.5)

    def worker_named(self, worker_id: str) -> str:
        """The name of the worker process a job record's `worker` (host-pid-stamp) names."""
        pid = int(worker_id.rsplit("-", 2)[1])
        return next(name for name, process in self.workers.items() if process.pid == pid)

    def running_jobs(self, name: str) -> int | None:
        """How many jobs a worker runs, by its heartbeat; None while it has none."""
        pid = self.workers[name].pid
        return next((info.running_jobs for info in self.heartbeats() if info.pid == pid), None)

    def log(self, name: str) -> str:
        return Path(self.processes.log_dir / f"{name}.log").read_text(errors="replace")


@dataclass
class RedisServer:
    """A private redis-server keeping its append-only file, which a test stops and starts again on
    the same port and folder, as a restarted Redis with persistence comes back."""

    processes: Processes
    port: int
    data_dir: Path
    options: tuple[str, ...] = AOF
    name: str = "redis"

    def start(self) -> str:
        """Start it (again); its URL once it answers, its file loaded."""
        return self.processes.start_redis(self.name, self.port, self.data_dir, *self.options)

    def stop(self, signum: signal.Signals = signal.SIGTERM) -> None:
        """SIGTERM: Redis writes its file out before it exits; SIGKILL: only what was written survives."""
        self.processes.signal(self.name, signum)
        self.processes.children[self.name].wait(WAIT_TIMEOUT)


def start_gateway_and_worker(processes: Processes, settings: Settings) -> tuple[Popen[bytes], str]:
    """A gateway and one worker on `settings`, once /health says both serve: the gateway, its URL."""
    gateway = processes.start("gateway", "gateway", settings)
    worker = processes.start("worker", "worker", settings)
    base_url = f"http://127.0.0.1:{settings.port}"
    assert wait_healthy(base_url, [gateway, worker], 1, SYSTEM_START_TIMEOUT), processes.log_dir
    return gateway, base_url


@pytest.fixture(scope="package")
def synthetic_pool(redis_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pool]:
    """Workers on the synthetic engine, whose answers end only at `max_tokens` or a stop: a test's job
    runs as long as it asks for. A module names it in a `pool` fixture of its own (its tests are then
    `unit`: see tests/conftest.py's `pytest_collection_modifyitems`)."""
    yield from run_pool(redis_url, tmp_path_factory, engine="synthetic", synthetic_mean_tokens=0)


def run_pool(
    redis_url: str, tmp_path_factory: pytest.TempPathFactory, engine: str, **overrides: object
) -> Iterator[Pool]:
    settings = make_settings(
        redis_url,
        port=free_port(),
        host="127.0.0.1",
        allow_unauthenticated=True,
        engine=engine,
        allow_runtime_lora_updating=True,  # tests/faults/test_runtime_adapters.py, tests/e2e/test_models.py
        adapter_load_wait_seconds=5.0,
        **RECOVERY,
        **overrides,
    )
    processes = Processes(tmp_path_factory.mktemp(f"fault-{engine}-logs"))
    gateway = processes.start("gateway", "gateway", settings)
    pool = Pool(settings, f"http://127.0.0.1:{settings.port}", processes)
    try:
        pool.ensure_workers()
        assert wait_healthy(pool.base_url, [gateway], WORKERS, SYSTEM_START_TIMEOUT), processes.log_dir
        yield pool
    finally:
        processes.stop_all()
        delete_prefix(redis_url, settings.key_prefix)


@pytest.fixture
async def gateway(deployment: Any) -> AsyncIterator[httpx.AsyncClient]:
    """A client of the gateway of a module's own `deployment` (one with a `base_url`), where a module
    starts its own gateway and worker instead of using the shared pool."""
    async with httpx.AsyncClient(base_url=deployment.base_url, timeout=120) as http:
        yield http


@pytest.fixture
async def client(pool: Pool) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=pool.base_url, timeout=120) as http:
        yield http


@pytest.fixture
async def synthetic_client(synthetic_system: System) -> AsyncIterator[httpx.AsyncClient]:
    """A client of the session's synthetic system (tests/conftest.py), for this package's tests whose
    subject is the gateway or the queue rather than workers that come and go (a gateway's stop,
    deadlines): their tests count as `unit`."""
    async with httpx.AsyncClient(base_url=synthetic_system.base_url, timeout=120) as http:
        yield http


async def wait_for_tokens(client: httpx.AsyncClient, job_id: str, count: int) -> dict[str, Any]:
    """The record once the running job has streamed `count` tokens (it must still be running)."""
    job = await wait_until(
        client,
        job_id,
        lambda job: job["status"] not in ("queued", "running") or job["output"]["token_count"] >= count,
        f"{count} tokens of job {job_id}",
        WAIT_TIMEOUT,
    )
    assert job["status"] == "running", f"the job ended before {count} tokens: {job}"
    return job


def assert_one_seamless_stream(events: list[dict[str, Any]]) -> None:
    """Every event once, in order (seq 0, 1, 2, ...), with exactly one terminal event, the last."""
    assert [event["seq"] for event in events] == list(range(len(events)))
    terminal = [event for event in events if event["type"] in ("done", "cancelled", "error")]
    assert terminal == [events[-1]]
    assert all(event["token_ids"] for event in deltas(events))
