"""Start streampool's own processes (gateway, worker) and redis-server for tests, each logging to a file."""

from __future__ import annotations

import contextlib
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
from pathlib import Path
from typing import IO

import httpx
import redis

from cli.launcher import child_environment
from shared.config import Settings
from tests.helpers import eventually_sync

ROOT = Path(__file__).resolve().parent.parent


PORTS_PER_PROCESS = 1500
PORTS_FROM = 20_000
"""Where the tests' servers listen: below the kernel's ephemeral range (32768 and up), which the
outgoing connections of every test process draw from, so that a port found free is not taken by a
client's connection before its server binds it; each test process (`-n`) has its own 1,500."""


def free_port() -> int:
    """A port nothing listens on, from this test process's own range."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0").removeprefix("gw")
    first = PORTS_FROM + (int(worker) if worker.isdigit() else 0) % 8 * PORTS_PER_PROCESS
    for port in random.sample(range(first, first + PORTS_PER_PROCESS), PORTS_PER_PROCESS):
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError(f"no free port from {first} to {first + PORTS_PER_PROCESS - 1}")


def redis_answers(url: str) -> bool:
    return _answers(redis.Redis.from_url(url, socket_connect_timeout=1))


def _answers(client: redis.Redis) -> bool:
    try:
        return bool(client.ping())
    except redis.RedisError:
        return False


def wait_answering(base_url: str, process: subprocess.Popen[bytes], timeout: float = 60) -> None:
    """Until a gateway answers HTTP at all, whatever its /health says (503 while no worker runs)."""

    def answers() -> bool:
        assert process.poll() is None, "the gateway exited"
        try:
            httpx.get(f"{base_url}/metrics", timeout=2).raise_for_status()
        except httpx.HTTPError:
            return False
        return True

    eventually_sync(answers, f"the gateway answers at {base_url}", timeout, interval=0.1)


class Processes:
    """Child processes started as a deployment starts them (`streampool gateway|worker`), stopped together.

    Every child writes its output to `<log_dir>/<name>.log`, which is where to look when a test fails.
    Each child leads a process group of its own, with the processes it starts (a worker's vLLM engine
    core and its engine worker): `kill` ends the group as a crashed machine or container would, and
    stopping a child also ends whatever of its group outlived it, so that no engine is left running.
    """

    def __init__(self, log_dir: Path) -> None:
        self.log_dir = log_dir
        self.children: dict[str, subprocess.Popen[bytes]] = {}
        self._logs: list[IO[bytes]] = []

    def start(self, name: str, role: str, settings: Settings) -> subprocess.Popen[bytes]:
        """`streampool <role>` (gateway or worker) with every setting passed through the environment."""
        return self._spawn(name, [sys.executable, "-m", "cli", role], env=child_environment(settings))

    def start_redis(
        self, name: str, port: int, data_dir: Path, *options: str, answering: redis.Redis | None = None
    ) -> str:
        """A private `redis-server` on `port` keeping its files in `data_dir`; its URL once it answers
        (or once `answering`, a client of it, has its answer: a server on TLS alone has port 0)."""
        server = shutil.which("redis-server")
        assert server, "redis-server is not installed (apt-get install redis-server)"
        data_dir.mkdir(parents=True, exist_ok=True)
        command = [server, "--port", str(port), "--bind", "127.0.0.1", "--dir", str(data_dir), "--save", ""]
        self._spawn(name, [*command, *options])
        url = f"redis://127.0.0.1:{port}/0"
        client = answering or redis.Redis.from_url(url, socket_connect_timeout=1)
        # A loaded machine may take seconds to start it: 10 s once ran out under eight spinning processes.
        eventually_sync(lambda: _answers(client), f"redis-server {name} answers", timeout=30)
        return url

    def start_sentinel(self, name: str, port: int, data_dir: Path, master: str, master_port: int) -> str:
        """A Sentinel (`redis-server --sentinel`) on `port` watching the master named `master`, with
        failure detection in one second, so that a failover takes seconds; its address once it answers.
        Sentinel rewrites its configuration file, so each one has its own in `data_dir`."""
        server = shutil.which("redis-server")
        assert server, "redis-server is not installed (apt-get install redis-server)"
        data_dir.mkdir(parents=True, exist_ok=True)
        config = data_dir / f"{name}.conf"
        config.write_text(
            f"port {port}\nbind 127.0.0.1\ndir {data_dir}\n"
            f"sentinel monitor {master} 127.0.0.1 {master_port} 2\n"
            f"sentinel down-after-milliseconds {master} 1000\n"
            f"sentinel failover-timeout {master} 10000\n"
        )
        self._spawn(name, [server, str(config), "--sentinel"])
        eventually_sync(
            lambda: redis_answers(f"redis://127.0.0.1:{port}"), f"Sentinel answers on port {port}"
        )
        return f"127.0.0.1:{port}"

    def _spawn(
        self, name: str, command: list[str], env: dict[str, str] | None = None
    ) -> subprocess.Popen[bytes]:
        log = open(self.log_dir / f"{name}.log", "ab")  # noqa: SIM115 - closed in stop_all
        self._logs.append(log)
        process = subprocess.Popen(
            command, env=env, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
        self.children[name] = process
        return process

    def log(self, name: str) -> str:
        """What the child named `name` has written so far."""
        return (self.log_dir / f"{name}.log").read_text(errors="replace")

    def signal(self, name: str, signum: signal.Signals) -> None:
        """`signum` to the child alone, as an orchestrator signals a container's main process."""
        self.children[name].send_signal(signum)

    def kill(self, name: str) -> None:
        """SIGKILL to the child and every process it started: a crash of its machine or container."""
        self._kill_group(self.children[name])

    @staticmethod
    def _kill_group(process: subprocess.Popen[bytes]) -> None:
        with contextlib.suppress(ProcessLookupError):  # the group is empty already
            os.killpg(process.pid, signal.SIGKILL)

    def stop(self, name: str, timeout: float = 60) -> int:
        """SIGTERM, then SIGKILL if the process has not exited after `timeout`; its exit code. What is
        left of its process group afterwards is killed."""
        process = self.children[name]
        if process.poll() is None:
            process.terminate()
        try:
            return process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self._kill_group(process)
            return process.wait()
        finally:
            self._kill_group(process)

    def stop_all(self) -> None:
        for process in self.children.values():
            if process.poll() is None:
                process.terminate()
        for name in self.children:
            self.stop(name)
        for log in self._logs:
            log.close()
