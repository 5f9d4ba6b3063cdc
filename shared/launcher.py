"""`streampool up`: Redis (started here when none answers), a gateway and a worker, as child processes."""

from __future__ import annotations

import logging
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from urllib.parse import urlparse

import httpx
import redis

from shared.config import DEFAULT_MODEL_DIR, Settings

HEALTH_TIMEOUT_SECONDS = 300
LOCAL_HOSTS = {"127.0.0.1", "localhost", "::1"}
STOP_MARGIN_SECONDS = 15.0


def _redis_answers(url: str) -> bool:
    try:
        return bool(redis.Redis.from_url(url, socket_connect_timeout=1).ping())
    except redis.RedisError:
        return False


def _start_redis(url: str) -> subprocess.Popen[bytes] | None:
    """A throw-away `redis-server` on the URL's port, when the URL points at this machine."""
    parsed = urlparse(url)
    if parsed.hostname not in LOCAL_HOSTS:
        raise SystemExit(f"Redis at {url} does not answer (and it is not on this machine to start it).")
    server = shutil.which("redis-server")
    if server is None:
        raise SystemExit(
            f"Redis at {url} does not answer and redis-server is not installed.\n"
            "Install it (Debian/Ubuntu: sudo apt-get install redis-server; macOS: brew install redis),\n"
            "or point STREAMPOOL_REDIS_URL at a running Redis."
        )
    port = str(parsed.port or 6379)
    print(f"streampool: no Redis at {url}; starting redis-server on port {port}", flush=True)
    process = subprocess.Popen(
        [server, "--port", port, "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"]
    )
    for _ in range(100):
        if _redis_answers(url):
            return process
        time.sleep(0.1)
    process.terminate()
    raise SystemExit("redis-server did not come up")


def child_environment(settings: Settings) -> dict[str, str]:
    """The parent's environment plus every effective setting, so children see what `up` saw."""
    env = dict(os.environ)
    for name, value in settings.model_dump().items():
        if value is not None:
            env[f"STREAMPOOL_{name.upper()}"] = str(value).lower() if isinstance(value, bool) else str(value)
    return env


def wait_healthy(
    base_url: str,
    processes: Sequence[subprocess.Popen[bytes]],
    workers: int = 1,
    timeout: float = HEALTH_TIMEOUT_SECONDS,
) -> bool:
    """True once the gateway's /health counts `workers` live workers; False if a process exits first."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if any(process.poll() is not None for process in processes):
            return False
        try:
            answer = httpx.get(f"{base_url}/health", timeout=2)
            if answer.status_code == 200 and answer.json()["workers"] >= workers:
                return True
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    return False


def _stop(processes: list[subprocess.Popen[bytes]], timeout: float) -> None:
    """SIGINT (the worker drains), then SIGKILL to whatever has not exited after `timeout`."""
    for process in processes:
        if process.poll() is None:
            process.send_signal(signal.SIGINT)
    for process in processes:
        try:
            process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            process.kill()


def _exit_on_sigterm(signum: int, frame: object) -> None:
    raise SystemExit(0)  # unwinds through run_all's `finally`, which stops the children


def run_all(settings: Settings) -> int:
    logging.getLogger("httpx").setLevel(logging.WARNING)  # the health polling below is not news
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    if settings.model == DEFAULT_MODEL_DIR:
        from worker.model_prep import prepare_model

        prepare_model(settings.model)
    elif not settings.model.is_dir():
        raise SystemExit(f"model folder {settings.model} does not exist")
    redis_server = None if _redis_answers(settings.redis_url) else _start_redis(settings.redis_url)
    # A local run needs no keys; keys given (api_keys, api_keys_file) are still required.
    env = child_environment(settings.model_copy(update={"allow_unauthenticated": True}))
    command = [sys.executable, "-m", "shared.cli"]
    children = [
        subprocess.Popen([*command, "gateway"], env=env),
        subprocess.Popen([*command, "worker"], env=env),
    ]
    host = "127.0.0.1" if settings.host in ("0.0.0.0", "::") else settings.host
    base_url = f"http://{host}:{settings.port}"
    try:
        if not wait_healthy(base_url, children):
            print("streampool: the gateway or the worker failed to start; see the log above", file=sys.stderr)
            return 1
        print(
            f"\nstreampool is up at {base_url}  (Ctrl-C stops everything)\n"
            f"  curl -N -X POST {base_url}/v1/jobs -H 'Content-Type: application/json' \\\n"
            '       -d \'{"prompt": "The capital of France is", "max_tokens": 32}\'\n'
            f"  curl -N {base_url}/v1/jobs/<id>/events -H 'Accept: text/event-stream'\n",
            flush=True,
        )
        while all(child.poll() is None for child in children):
            time.sleep(0.5)
        return 1
    except KeyboardInterrupt:
        return 0
    finally:
        # The worker's drain, then the time it needs to hand its jobs over and stop its engine.
        stop_timeout = settings.drain_seconds + STOP_MARGIN_SECONDS
        _stop(children + ([redis_server] if redis_server else []), stop_timeout)
