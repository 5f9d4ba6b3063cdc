"""A real gateway process that requires API keys, with no worker: jobs it takes stay queued."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from shared.config import Settings
from shared.keys import Keys
from tests.conftest import make_settings
from tests.processes import Processes, free_port, wait_answering
from tests.redis_cleanup import delete_prefix

KEY_A = f"key-a-{uuid.uuid4().hex}"
KEY_B = f"key-b-{uuid.uuid4().hex}"  # given in a keys file, KEY_A in the list


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


@dataclass
class KeyedGateway:
    settings: Settings
    base_url: str
    pid: int

    @property
    def keys(self) -> Keys:
        return Keys.of(self.settings)


def run_keyed_gateway(redis_url: str, folder: Path, **overrides: object) -> Iterator[KeyedGateway]:
    """Start the gateway under a fresh key prefix; stop it and delete every key its jobs made afterwards."""
    keys_file = folder / "keys"
    keys_file.write_text(f"\n{KEY_B}\n\n")
    yield from run_gateway(redis_url, folder, api_keys=f" {KEY_A} ,", api_keys_file=keys_file, **overrides)


def run_gateway(redis_url: str, folder: Path, **overrides: object) -> Iterator[KeyedGateway]:
    """`run_keyed_gateway` with the settings given (`allow_unauthenticated=True` for one without keys)."""
    settings = make_settings(redis_url, port=free_port(), host="127.0.0.1", **overrides)
    processes = Processes(folder)
    gateway = processes.start("gateway", "gateway", settings)
    base_url = f"http://127.0.0.1:{settings.port}"
    try:
        wait_answering(base_url, gateway)
        yield KeyedGateway(settings, base_url, gateway.pid)
    finally:
        processes.stop_all()
        delete_prefix(redis_url, settings.key_prefix)
