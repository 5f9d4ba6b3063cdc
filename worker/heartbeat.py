"""A worker's heartbeat: a key with a TTL saying it is alive and which model it serves (indexed
for gateways, `shared.workers`), and the renewal of the leases of the jobs it runs."""

from __future__ import annotations

import logging
import os
import socket
import time
from collections.abc import Callable

import redis.asyncio as aioredis

from shared.keys import Keys
from shared.workers import WorkerInfo, announce, withdraw
from worker.leases import Leases

log = logging.getLogger(__name__)


class Heartbeat:
    def __init__(
        self,
        redis: aioredis.Redis,
        keys: Keys,
        describe: Callable[[], WorkerInfo],
        leases: Leases,
        held: Callable[[], list[str]],
        ttl: float,
    ) -> None:
        self.redis = redis
        self.keys = keys
        self.describe = describe
        self.leases = leases
        self.held = held
        self.ttl_ms = int(ttl * 1000)

    async def beat(self) -> None:
        """Renew the leases of the jobs this worker runs (one round trip for all), then say it lives."""
        info = self.describe()
        for job_id in await self.leases.renew(info.worker_id, self.held()):
            log.warning("job %s: lease lost (lapsed or taken over); its next step stops it here", job_id)
        await announce(self.redis, self.keys, info, self.ttl_ms)

    async def forget(self, worker_id: str) -> None:
        """Remove the heartbeat at once, so that gateways stop counting this worker."""
        await withdraw(self.redis, self.keys, worker_id)


def new_worker_id() -> str:
    """Host name, pid and ms: never an '@', which a lease puts between its holder and a cancel asked
    for (`shared/lifecycle/lease.lua`)."""
    return f"{socket.gethostname()}-{os.getpid()}-{int(time.time() * 1000) % 100000:05d}"
