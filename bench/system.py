"""The system under test: a gateway and a worker as `python -m` subprocesses under the bench's own prefix."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

import httpx
import psutil
import redis

from cli.launcher import child_environment, wait_healthy
from shared.config import Settings
from tests.redis_cleanup import delete_prefix
from worker import cpu_placement

ROOT = Path(__file__).resolve().parent.parent
START_TIMEOUT_SECONDS = 300


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def bench_settings(redis_url: str, **overrides: object) -> Settings:
    """Settings of one bench run: a fresh key prefix and ports, so nothing collides with anyone else's."""
    values: dict[str, object] = {
        "redis_url": redis_url,
        "key_prefix": f"spbench-{uuid.uuid4().hex[:8]}",
        "host": "127.0.0.1",
        "port": free_port(),
        "metrics_port": free_port(),
        "log_level": "WARNING",
        "max_queued_jobs": 0,
        "allow_unauthenticated": True,
    }
    values.update(overrides)
    return Settings(**values)  # type: ignore[arg-type]


@dataclass
class Child:
    """One streampool process and its log file."""

    name: str
    process: subprocess.Popen[bytes]
    log: IO[bytes]
    handle: psutil.Process = field(init=False)

    def __post_init__(self) -> None:
        self.handle = psutil.Process(self.process.pid)

    def cpu_seconds(self) -> float:
        times = self.handle.cpu_times()
        return float(times.user + times.system)

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
        try:
            self.process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self.log.close()


def start(name: str, module_args: list[str], settings: Settings, log_dir: Path) -> Child:
    log_dir.mkdir(parents=True, exist_ok=True)
    log = open(log_dir / f"{name}.log", "wb")  # noqa: SIM115 - closed by Child.stop
    process = subprocess.Popen(
        [sys.executable, "-m", *module_args],
        env=child_environment(settings),
        cwd=ROOT,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    return Child(name, process, log)


def start_gateway(settings: Settings, log_dir: Path) -> Child:
    return start("gateway", ["cli", "gateway"], settings, log_dir)


def start_worker(settings: Settings, log_dir: Path) -> Child:
    return start("worker", ["cli", "worker"], settings, log_dir)


def worker_metrics_url(settings: Settings) -> str:
    return f"http://127.0.0.1:{settings.metrics_port}/metrics"


def base_url(settings: Settings) -> str:
    return f"http://127.0.0.1:{settings.port}"


def wait_ready(settings: Settings, children: list[Child], workers: int) -> None:
    """Until /health counts `workers` live workers."""
    processes = [child.process for child in children]
    if not wait_healthy(base_url(settings), processes, workers, START_TIMEOUT_SECONDS):
        raise RuntimeError(f"not ready in {START_TIMEOUT_SECONDS} s, or a process exited; see their logs")


def wait_answering(settings: Settings, gateway: Child) -> None:
    """Until the gateway answers HTTP (its /health says 503 while no worker runs)."""
    deadline = time.monotonic() + START_TIMEOUT_SECONDS
    while gateway.process.poll() is None and time.monotonic() < deadline:
        try:
            httpx.get(f"{base_url(settings)}/metrics", timeout=2).raise_for_status()
            return
        except httpx.HTTPError:
            time.sleep(0.2)
    raise RuntimeError("the gateway did not start; see its log")


def start_redis(log_dir: Path) -> tuple[subprocess.Popen[bytes], str]:
    """A private redis-server on a free port: INFO figures then count this system's commands only."""
    port = free_port()
    log_dir.mkdir(parents=True, exist_ok=True)
    process = subprocess.Popen(
        ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"],
        stdout=open(log_dir / "redis.log", "wb"),  # noqa: SIM115 - lives as long as the server
        stderr=subprocess.STDOUT,
    )
    url = f"redis://127.0.0.1:{port}/0"
    client = redis.Redis.from_url(url)
    for _ in range(100):
        try:
            if client.ping():
                return process, url
        except redis.RedisError:
            time.sleep(0.1)
    process.terminate()
    raise RuntimeError("redis-server did not come up")


def start_system(
    settings: Settings, log_dir: Path, redis_server: subprocess.Popen[bytes] | None, children: list[Child]
) -> tuple[list[psutil.Process], tuple[set[int], set[int]] | None]:
    """A gateway and one worker, appended to `children` as they start (so that the caller stops them
    whatever happens), ready, with the gateway, Redis and this process on the worker's cores
    (`share_worker_cores`). Answers the processes so placed and the placement."""
    children += [start_gateway(settings, log_dir), start_worker(settings, log_dir)]
    wait_ready(settings, children, workers=1)
    serving = [children[0].handle, psutil.Process()]
    serving += [psutil.Process(redis_server.pid)] if redis_server is not None else []
    return serving, share_worker_cores(children[1], serving)


def share_worker_cores(worker: Child, others: list[psutil.Process]) -> tuple[set[int], set[int]] | None:
    """On a CPU host, bind `others` (gateway, Redis, this process) to the cores the worker keeps off its
    model runner's, as docs/scaling.md advises where they share the host: the in-process side runs there too.

    Answers (the cores they had, the cores they are bound to now); None where the worker is not bound.
    """
    allowed, worker_cores = set(os.sched_getaffinity(0)), set(worker.handle.cpu_affinity())
    if worker_cores >= allowed:
        return None
    for process in others:
        cpu_placement.bind(process, worker_cores)
    return allowed, worker_cores


def tear_down(
    children: list[Child], url: str, prefix: str, redis_server: subprocess.Popen[bytes] | None
) -> int:
    """Stop the run's processes, delete its keys (under `prefix`), and stop the private Redis it started,
    if any; how many keys were deleted."""
    for child in children:
        child.stop()
    deleted = delete_prefix(url, prefix)
    if redis_server is not None:
        redis_server.terminate()
        redis_server.wait()
    return deleted
