"""Shared fixtures: a real Redis, and one running system (a gateway and two real workers) per session.

The workers run the real vLLM engine with the default model, as separate processes
started by the `streampool` command, exactly as a deployment runs them. Every
session writes under its own key prefix, so it never sees another's keys.

Also, for the unit tests: a gateway process with API keys (`keyed`), and the default model's card
(`model_card`), each made once per test process; a Redis Cluster of the module's own (`redis_cluster`),
and a Redis of the module's own for the job streams alone (`streams_url`); and how `-n` deals the
tests out (tests/schedule.py).
"""

from __future__ import annotations

import fcntl
import os
import subprocess
import uuid
from collections.abc import AsyncIterator, Callable, Generator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import httpx
import pytest
import redis.asyncio as aioredis

from cli.launcher import wait_healthy
from shared.config import DEFAULT_MODEL_DIR, Settings
from shared.jobstore import JobStore
from shared.keys import Keys
from shared.model_card import ModelCard
from tests import schedule
from tests.gateway.stand_ins import CARD_CONTEXT, CARD_MODEL
from tests.lora_adapter import ADAPTER, make_adapter
from tests.processes import Processes, free_port, redis_answers
from tests.redis_cleanup import delete_prefix
from tests.redis_cluster import ClusteredRedis
from tests.scripted_pool import SCRIPTED_POOL
from worker.model_card import build_model_card

if TYPE_CHECKING:
    from tests.faults.conftest import Pool
    from tests.gateway.keyed_gateway import KeyedGateway

SYSTEM_START_TIMEOUT = 240
WORKERS = 2

ENGINE_FIXTURES = frozenset({"system", "pool"})
"""Every fixture that starts workers on the real engine: `system` and `pool`, both here. Fixtures of
workers on the synthetic engine (`STREAMPOOL_ENGINE=synthetic`: tests/faults' `outage`,
`waiting_worker`, `impatient_worker` and the Redis outage's and failover's `deployment`, tests/scale's
`cluster`, tests/e2e/test_models.py's `models_pool`) start in a second: their tests count as `unit`."""
SYNTHETIC_FIXTURES = frozenset({"synthetic_system", "synthetic_pool"})
"""The synthetic twins of `system` and `pool`, which a module names in a `system` or `pool` fixture of its
own: its tests use no engine, though they use a fixture of that name."""
SLOW_PATHS = (
    "tests/e2e/",
    "tests/faults/",
    "tests/scale/",
    "tests/shared/test_redis_cluster_client.py",
    "tests/shared/test_streams_on_cluster.py",
    "tests/shared/test_replication.py",
    "tests/cli/test_client_commands.py",
    "tests/worker/test_constraint_compile.py",
)
"""Where the `unit` tests are whole deployments (gateways and synthetic workers of their own, killed,
stopped or cut off from Redis; browsers), Redis clusters and replicas of their own, a process a test
(the client's commands; a compiler's child that imports torch): seconds each, or tens to start. They
are `slow` too, which `make test-fast` leaves to `make test`; the rest of each part's tests stay in it."""


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--fuzz-examples",
        type=int,
        metavar="N",
        help="examples a route in tests/fuzz, instead of its EXAMPLES_PER_ROUTE (make test-fast: fewer)",
    )


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Every test is `system` when it uses an engine-starting fixture, directly or through another
    fixture (and no SYNTHETIC_FIXTURES, whose workers need no engine), and `unit` otherwise: a new
    test is classified by what it uses; a test under SLOW_PATHS is also `slow` (`make test-fast` runs
    `-m "unit and not slow"`, `make test` every test). In a test process of `-n`,
    the tests are ordered as tests/schedule.py deals them; in one process, the modules with engines of
    their own go first (tests/schedule.py's ENGINES_FIRST)."""
    for item in items:
        # A parametrize argument named like a fixture (tests/deploy's `deployment`) replaces it.
        callspec = getattr(item, "callspec", None)
        used = set(getattr(item, "fixturenames", ())) - set(callspec.params if callspec else ())
        on_engine = bool(used & ENGINE_FIXTURES) and not used & SYNTHETIC_FIXTURES
        item.add_marker(pytest.mark.system if on_engine else pytest.mark.unit)
        if item.nodeid.startswith(SLOW_PATHS):
            item.add_marker(pytest.mark.slow)
    if os.environ.get("PYTEST_XDIST_WORKER"):
        items.sort(key=schedule.rank)  # stable: each module's tests keep their order
    else:
        items.sort(key=schedule.engines_first)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: object) -> schedule.GroupScheduling | None:
    """`-n`'s default distribution (`load`) by tests/schedule.py's groups; any other `--dist` as asked."""
    return schedule.GroupScheduling(config, log) if config.getvalue("dist") == "load" else None


@pytest.fixture(scope="session")
def redis_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The Redis at STREAMPOOL_REDIS_URL (or the default); a private redis-server when none answers."""
    url = os.environ.get("STREAMPOOL_REDIS_URL", "redis://127.0.0.1:6379/0")
    if redis_answers(url):
        yield url
        return
    processes = Processes(tmp_path_factory.mktemp("redis"))
    yield processes.start_redis("redis", free_port(), processes.log_dir, "--appendonly", "no")
    processes.stop_all()


@pytest.fixture(scope="module")
def redis_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ClusteredRedis]:
    """Three masters and their replicas (tests/redis_cluster.py), made once for the module that uses
    them: starting six servers and forming the cluster takes seconds. A test that kills a node starts
    it again before it ends (`ClusteredRedis.restart`), and writes under keys of its own."""
    processes = Processes(tmp_path_factory.mktemp("redis-cluster"))
    try:
        yield ClusteredRedis.start(processes)
    finally:
        processes.stop_all()


@pytest.fixture(scope="module")
def streams_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A private redis-server for the job streams (`streams_redis_url`), the module's own: the rest
    stays on the suite's Redis, so a key on the wrong one shows."""
    processes = Processes(tmp_path_factory.mktemp("streams-redis"))
    yield processes.start_redis("streams", free_port(), processes.log_dir, "--appendonly", "no")
    processes.stop_all()


def make_settings(redis_url: str, **overrides: object) -> Settings:
    values: dict[str, object] = {
        "redis_url": redis_url,
        "key_prefix": f"sptest-{uuid.uuid4().hex[:8]}",
        "heartbeat_seconds": 0.5,
        "heartbeat_ttl_seconds": 3.0,
        "log_level": "INFO",
        # What the workers serve (the default model's folder name), as a deployment declares it: jobs
        # that name no model go there, also before any worker has started.
        "default_model": DEFAULT_MODEL_DIR.name,
    }
    values.update(overrides)
    return Settings(**values)  # type: ignore[arg-type]


@dataclass
class System:
    """A running gateway and workers, and the settings they share."""

    settings: Settings
    base_url: str
    gateway: subprocess.Popen[bytes]
    workers: list[subprocess.Popen[bytes]]
    log_dir: Path
    worker_urls: list[str]
    """Each worker's /health and /metrics server."""

    @property
    def keys(self) -> Keys:
        return Keys.of(self.settings)


SYSTEM_ENGINE: dict[str, object] = {
    "engine": "vllm",
    "enable_auto_tool_choice": True,
    "tool_call_parser": "pythonic",
}
"""What `system` starts its workers' engines with, beside the defaults: tests/e2e/test_beside_vllm_server.py
starts vLLM's own server on the same."""


@pytest.fixture(scope="session")
def system(redis_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[System]:
    """A gateway and two workers on the real engine, started once for the whole run, as `streampool`
    processes; with vLLM's `pythonic` tool-call parser, whose `required` and named tool choices hold
    the default model to the tools' JSON schemas."""
    yield from run_system(redis_url, tmp_path_factory, **SYSTEM_ENGINE)


@pytest.fixture(scope="session")
def synthetic_system(redis_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[System]:
    """The same on the synthetic engine, which starts in a second: for the modules whose subject is
    the relay, the queue or a client of the gateway rather than generation. Such a module names it in
    a `system` fixture of its own (its tests are then `unit`: see `pytest_collection_modifyitems`).
    Its answers end only at `max_tokens` or a stop: a test's job runs as long as it asks for."""
    yield from run_system(redis_url, tmp_path_factory, engine="synthetic", synthetic_mean_tokens=0)


def run_system(
    redis_url: str,
    tmp_path_factory: pytest.TempPathFactory,
    engine: str,
    workers: int = WORKERS,
    **overrides: object,
) -> Generator[System, None, None]:
    settings = make_settings(
        redis_url, port=free_port(), host="127.0.0.1", allow_unauthenticated=True, engine=engine, **overrides
    )
    logs = tmp_path_factory.mktemp(f"system-{engine}-logs")
    processes = Processes(logs)
    gateway = processes.start("gateway", "gateway", settings)
    # Each worker on a metrics port of its own: several share this machine.
    metrics_ports = [free_port() for _ in range(workers)]
    started = [
        processes.start(f"worker-{n}", "worker", settings.model_copy(update={"metrics_port": port}))
        for n, port in enumerate(metrics_ports)
    ]
    worker_urls = [f"http://127.0.0.1:{port}" for port in metrics_ports]
    base_url = f"http://127.0.0.1:{settings.port}"
    try:
        if not wait_healthy(base_url, [gateway, *started], workers, SYSTEM_START_TIMEOUT):
            raise RuntimeError(f"the system did not become healthy; logs in {logs}")
        yield System(settings, base_url, gateway, started, logs, worker_urls)
    finally:
        processes.stop_all()
        delete_prefix(redis_url, settings.key_prefix)


@pytest.fixture(scope="session")
def tool_system(redis_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[System]:
    """A gateway and synthetic workers of the scripted pool that thinks and calls tools
    (tests/scripted_pool.py): the tests of agents and of the Responses API's function tools."""
    if not DEFAULT_MODEL_DIR.is_dir():
        pytest.skip("the default model is not prepared (make setup)")
    # One worker: each imports vLLM for its parsers, seconds of CPU that a second would only repeat.
    yield from run_system(
        redis_url, tmp_path_factory, workers=1, synthetic_step_seconds=0.005, **SCRIPTED_POOL
    )


@pytest.fixture(scope="session")
def pool(redis_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pool]:
    """Two workers on the real engine that tests may take away (tests/faults' short leases and drain),
    serving the default model and a LoRA adapter of it, `ADAPTER`: one engine start for the tests of
    an engine's death and of the adapter (tests/e2e/test_models.py), instead of one each. Adapter jobs
    change nothing for a test of the engine's death, nor a worker gone for one of the adapter."""
    from tests.faults.conftest import run_pool  # not at the top: it imports this module

    adapter = f"{ADAPTER}={make_adapter(tmp_path_factory.mktemp('adapter'))}"
    yield from run_pool(redis_url, tmp_path_factory, engine="vllm", lora=[adapter])


@pytest.fixture(scope="session")
def keyed(redis_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[KeyedGateway]:
    """A gateway process that requires API keys, with no worker, shared by the tests that need no other
    settings (tests/schedule.py runs them in one process); every test makes jobs of its own."""
    from tests.gateway.keyed_gateway import run_keyed_gateway  # not at the top: it imports this module

    yield from run_keyed_gateway(redis_url, tmp_path_factory.mktemp("keyed"))


@pytest.fixture(scope="session")
def model_card(tmp_path_factory: pytest.TempPathFactory) -> ModelCard | None:
    """The default model's card as a worker builds it, or None when the model is not prepared. Building
    it (importing transformers, loading the tokenizer) takes seconds of CPU: under `-n` the first test
    process that needs it builds it into the run's temporary folder, and the others read it there."""
    if not DEFAULT_MODEL_DIR.is_dir():
        return None
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        return _build_card()
    stored = tmp_path_factory.getbasetemp().parent / "model-card.json"  # the workers' common folder
    with open(stored.with_suffix(".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released as the file closes
        if not stored.exists():
            stored.write_text(_build_card().model_dump_json())
    return ModelCard.model_validate_json(stored.read_text())


def _build_card() -> ModelCard:
    built = build_model_card(DEFAULT_MODEL_DIR, CARD_MODEL, CARD_CONTEXT)
    assert built is not None
    return built


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
    """Every key under a test's prefix."""
    names = [name async for name in client.scan_iter(match=f"{keys.prefix}:*", count=1000)]
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
        made.append(JobStore(redis_client, Keys.of(settings), settings))
        return made[-1]

    yield make
    for store in made:
        await delete_test_keys(redis_client, store.keys)


@pytest.fixture
def store(store_factory: Callable[..., JobStore]) -> JobStore:
    return store_factory()
