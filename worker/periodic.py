"""A task that repeats an action at an interval and outlives Redis outages: the heartbeat, the reaper."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable

from redis.exceptions import RedisError

from shared.errors import BackendUnavailable

log = logging.getLogger(__name__)


class Periodic:
    """Runs `action` every `interval` seconds until stopped; a round that cannot reach Redis is
    skipped (said once when it starts failing and once when it works again), never fatal."""

    def __init__(self, name: str, action: Callable[[], Awaitable[None]], interval: float) -> None:
        self.name = name
        self.action = action
        self.interval = interval
        self._task: asyncio.Task[None] | None = None
        self._failing = False

    async def _run(self) -> None:
        while True:
            try:
                await self.action()
            except (BackendUnavailable, RedisError) as exc:
                if not self._failing:
                    log.warning("%s failed, trying again every %.1f s: %s", self.name, self.interval, exc)
                self._failing = True
            else:
                if self._failing:
                    log.info("%s works again", self.name)
                self._failing = False
            await asyncio.sleep(self.interval)

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name=self.name)

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
