"""What the engine-free gateway tests stand in for: a private redis-server (for figures that are
server-wide, such as INFO commandstats and memory), and a worker's heartbeat."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import redis.asyncio as aioredis

from shared.keys import Keys
from shared.workers import WorkerInfo, announce
from tests.processes import Processes, free_port

CARD_MODEL = "SmolLM2-135M-Instruct"  # the model card of the `model_card` fixture: the default model
CARD_CONTEXT = 2048


@contextmanager
def private_redis(folder: Path, *options: str) -> Iterator[str]:
    """A redis-server of this test's own (`options` added to its command line); its URL."""
    processes = Processes(folder)
    try:
        yield processes.start_redis("redis", free_port(), folder / "data", "--appendonly", "no", *options)
    finally:
        processes.stop_all()


async def heartbeat(
    redis: aioredis.Redis,
    keys: Keys,
    worker_id: str,
    model: str,
    *,
    ttl_ms: int = 60_000,
    dtype: str | None = None,
    running_jobs: int = 0,
    aliases: list[str] | None = None,
    adapters: list[str] | None = None,
    max_model_len: int = 512,
    max_chars_per_token: int | None = None,
) -> None:
    """A heartbeat as a live worker writes it (no job is ever run by this worker), saying it runs
    `running_jobs`."""
    now = time.time()
    info = WorkerInfo(
        worker_id=worker_id,
        model=model,
        aliases=aliases or [],
        adapters=adapters or [],
        max_model_len=max_model_len,
        max_chars_per_token=max_chars_per_token,
        dtype=dtype,
        running_jobs=running_jobs,
        engine_requests=0,
        started_at=now,
        heartbeat_at=now,
        host="test",
        pid=0,
    )
    await announce(redis, keys, info, ttl_ms)
