"""A worker's heartbeat: a key with a TTL saying it is alive and which model it serves."""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import time
from collections.abc import Callable

import redis.asyncio as aioredis
from redis.exceptions import RedisError

from shared.keys import Keys
from shared.workers import WorkerInfo

log = logging.getLogger(__name__)


class Heartbeat:
    def __init__(
        self,
        redis: aioredis.Redis,
        keys: Keys,
        describe: Callable[[], WorkerInfo],
        interval: float,
        ttl: float,
    ) -> None:
        self.redis = redis
        self.keys = keys
        self.describe = describe
        self.interval = interval
        self.ttl_ms = int(ttl * 1000)
        self._task: asyncio.Task[None] | None = None

    async def beat(self) -> None:
        info = self.describe()
        await self.redis.set(self.keys.worker(info.worker_id), info.model_dump_json(), px=self.ttl_ms)

    async def _run(self) -> None:
        while True:
            try:
                await self.beat()
            except RedisError as exc:  # Redis may come back; the next beat tries again
                log.warning("heartbeat failed: %s", exc)
            await asyncio.sleep(self.interval)

    def start(self) -> None:
        self._task = asyncio.create_task(self._run())

    async def stop(self, worker_id: str) -> None:
        if self._task is not None:
            self._task.cancel()
        try:
            await self.redis.delete(self.keys.worker(worker_id))
        except RedisError:
            pass


def new_worker_id() -> str:
    return f"{socket.gethostname()}-{os.getpid()}-{int(time.time() * 1000) % 100000:05d}"
