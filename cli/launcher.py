"""`streampool up`: Redis (started here when none answers), a gateway and a worker, as child processes."""

from __future__ import annotations

import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from urllib.parse import urlparse

import httpx
import redis

from shared.config import DEFAULT_MODEL_DIR, ENGINE_FLAG_SETTINGS, RedisSettings, Settings
from shared.redis_url import is_sentinel

HEALTH_TIMEOUT_SECONDS = 300
LOOPBACK = "127.0.0.1"
LOCAL_HOSTS = {LOOPBACK, "localhost", "::1"}
STOP_MARGIN_SECONDS = 15.0
WATCH_SECONDS = 0.5
# A worker that dies again soon after its start (an engine that cannot load) is restarted after a
# pause that doubles each time, up to a minute, instead of loading the model twice a second.
RESTART_PAUSE_MAX_SECONDS = 60.0
SHORT_LIFE_SECONDS = 60.0


def _redis_answers(url: str) -> bool:
    if is_sentinel(url):  # Sentinels find a master of their own: nothing to start here
        return True
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


def child_environment(settings: RedisSettings) -> dict[str, str]:
    """The parent's environment plus every effective setting, so children see what `up` saw (each
    child reads its own role's and leaves the rest)."""
    env = dict(os.environ)
    for name, value in settings.model_dump().items():
        # A setting under an engine flag's name, left at its default, stays unset: the worker's engine
        # flags may then set it without contradicting a value nobody gave.
        if value is not None and (name not in ENGINE_FLAG_SETTINGS or name in settings.model_fields_set):
            env[f"STREAMPOOL_{name.upper()}"] = _variable(name, value)
    return env


def _variable(name: str, value: object) -> str:
    """A setting's value as its variable spells it: lists comma-separated (`shared.config.Names`), the
    engine's flags a JSON list (`shared.config.EngineFlags`: a flag's value may hold a comma)."""
    if name == "engine_args":
        return json.dumps(value)
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, list):
        return ",".join(map(str, value))
    return str(value)


def local_settings(settings: Settings) -> Settings:
    """What `up` runs its gateway and worker with: no API keys needed (keys given are still
    required), and the gateway on this machine only unless a host was asked for (`--host` or
    STREAMPOOL_HOST): a local run without keys must not be open to the network by default."""
    update: dict[str, object] = {"allow_unauthenticated": True}
    if "host" not in settings.model_fields_set:
        update["host"] = LOOPBACK
    return settings.model_copy(update=update)


def reach(settings: Settings) -> str:
    """Who can reach the gateway `up` started, for its banner."""
    if settings.host in LOCAL_HOSTS:
        return "this machine only; --host 0.0.0.0 opens it to the network (set --api-keys first)"
    if settings.api_keys or settings.api_keys_file:
        return f"the network, on {settings.host}; clients need an API key"
    return f"the network, on {settings.host}, WITHOUT API keys: anyone who reaches it may use every job"


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


def supervise(
    gateway: subprocess.Popen[bytes],
    worker: subprocess.Popen[bytes],
    start_worker: Callable[[], subprocess.Popen[bytes]],
    children: list[subprocess.Popen[bytes]],
) -> int:
    """Watch the children until the gateway exits (answers 1); a worker that exits non-zero (its
    engine died) is replaced, as compose and Kubernetes replace one. `children` holds the live ones,
    for the caller to stop."""
    pause, started_at = WATCH_SECONDS, time.monotonic()
    while gateway.poll() is None:
        status = worker.poll()
        if status == 0:  # stopped on purpose: nothing left to serve jobs
            return 1
        if status is not None:
            lived = time.monotonic() - started_at
            pause = (
                WATCH_SECONDS if lived >= SHORT_LIFE_SECONDS else min(2 * pause, RESTART_PAUSE_MAX_SECONDS)
            )
            print(
                f"streampool: the worker exited with status {status}; starting a new one in {pause:.0f} s",
                flush=True,
            )
            children.remove(worker)
            time.sleep(pause)
            worker, started_at = start_worker(), time.monotonic()
            children.append(worker)
        time.sleep(WATCH_SECONDS)
    return 1


def _exit_on_sigterm(signum: int, frame: object) -> None:
    raise SystemExit(0)  # unwinds through run_all's `finally`, which stops the children


def run_all(settings: Settings) -> int:
    logging.getLogger("httpx").setLevel(logging.WARNING)  # the health polling below is not news
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    if settings.model == DEFAULT_MODEL_DIR:
        from cli.model_prep import prepare_model

        prepare_model(settings.model)
    elif not settings.model.is_dir():
        raise SystemExit(f"model folder {settings.model} does not exist")
    redis_server = None if _redis_answers(settings.redis_url) else _start_redis(settings.redis_url)
    settings = local_settings(settings)
    env = child_environment(settings)
    command = [sys.executable, "-m", "cli"]

    def start_worker() -> subprocess.Popen[bytes]:
        return subprocess.Popen([*command, "worker"], env=env, process_group=0)

    # Each child in a process group of its own: Ctrl-C reaches `up` alone, which then stops each
    # child once. A second SIGINT makes uvicorn and arq give up their graceful stops.
    children = [subprocess.Popen([*command, "gateway"], env=env, process_group=0), start_worker()]
    host = LOOPBACK if settings.host in ("0.0.0.0", "::") else settings.host
    base_url = f"http://{host}:{settings.port}"
    try:
        if not wait_healthy(base_url, children):
            print("streampool: the gateway or the worker failed to start; see the log above", file=sys.stderr)
            return 1
        print(
            f"\nstreampool is up at {base_url}  (Ctrl-C stops everything)\n"
            f"  reachable from {reach(settings)}\n"
            f"  curl -N -X POST {base_url}/v1/jobs -H 'Content-Type: application/json' \\\n"
            '       -d \'{"prompt": "The capital of France is", "max_tokens": 32}\'\n'
            f"  curl -N {base_url}/v1/jobs/<id>/events -H 'Accept: text/event-stream'\n",
            flush=True,
        )
        return supervise(children[0], children[1], start_worker, children)
    except KeyboardInterrupt:
        return 0
    finally:
        # The worker's drain (or the gateway's grace for OpenAI and TGI answers, whichever is longer),
        # then the time the worker needs to hand its jobs over and stop its engine.
        stop_timeout = max(settings.drain_seconds, settings.shutdown_grace_seconds) + STOP_MARGIN_SECONDS
        _stop(children + ([redis_server] if redis_server else []), stop_timeout)
