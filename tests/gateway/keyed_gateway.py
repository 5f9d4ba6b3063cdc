"""A real gateway process that requires API keys, with no worker: jobs it takes stay queued."""

from __future__ import annotations

import subprocess
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import redis

from shared.config import Settings
from shared.keys import Keys
from tests.conftest import make_settings
from tests.processes import Processes, free_port

KEY_A = f"key-a-{uuid.uuid4().hex}"
KEY_B = f"key-b-{uuid.uuid4().hex}"  # given in a keys file, KEY_A in the list
START_TIMEOUT = 60


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


@dataclass
class KeyedGateway:
    settings: Settings
    base_url: str


def _wait_answering(base_url: str, process: subprocess.Popen[bytes]) -> None:
    """Until the gateway answers HTTP at all (its /health says 503: no worker runs)."""
    deadline = time.monotonic() + START_TIMEOUT
    while time.monotonic() < deadline:
        assert process.poll() is None, "the gateway exited"
        try:
            httpx.get(f"{base_url}/health", timeout=2)
            return
        except httpx.TransportError:
            time.sleep(0.1)
    raise AssertionError("the gateway did not answer")


def _delete_keys(redis_url: str, prefix: str) -> None:
    """Every key under the prefix, and arq's job keys (arq's own prefix) of the prefix's jobs.

    Synchronous, unlike conftest's `delete_test_keys`: fixtures of browser tests tear down
    inside Playwright's running event loop.
    """
    client = redis.Redis.from_url(redis_url, decode_responses=True)
    names = list(client.scan_iter(match=f"{prefix}:*", count=1000))
    job_ids = {name.split(":")[2] for name in names if name.startswith(f"{prefix}:job:")}
    names += [Keys(prefix).arq_job(job_id) for job_id in job_ids]
    for start in range(0, len(names), 1000):
        client.delete(*names[start : start + 1000])
    client.close()


def run_keyed_gateway(redis_url: str, folder: Path, **overrides: object) -> Iterator[KeyedGateway]:
    """Start the gateway under a fresh key prefix; stop it and delete every key its jobs made afterwards."""
    keys_file = folder / "keys"
    keys_file.write_text(f"\n{KEY_B}\n\n")
    settings = make_settings(
        redis_url,
        port=free_port(),
        host="127.0.0.1",
        api_keys=f" {KEY_A} ,",
        api_keys_file=keys_file,
        **overrides,
    )
    processes = Processes(folder)
    gateway = processes.start("gateway", "gateway", settings)
    base_url = f"http://127.0.0.1:{settings.port}"
    try:
        _wait_answering(base_url, gateway)
        yield KeyedGateway(settings, base_url)
    finally:
        processes.stop_all()
        _delete_keys(redis_url, settings.key_prefix)
