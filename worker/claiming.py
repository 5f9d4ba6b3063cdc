"""How this worker claims its model's jobs (`claim.lua`) beyond taking the next one: the output tokens
of the jobs it ended, charged to their tenants' shares at its next claim (fair shares count tokens),
and the prefixes its engine's cache holds, told as it starts each prompt and preferred as it claims.
"""

from __future__ import annotations

from collections.abc import Callable

import redis.asyncio as aioredis

from shared.config import WorkerSettings
from shared.keys import Keys
from shared.lifecycle.claims import Affinity, advertise, claim
from shared.scheduling import block_hashes
from worker.engine import PrefixCache

AFFINITY_WINDOW = 16
"""How many of a tenant's head jobs a claim looks at for one whose prefix this worker holds."""
BLOCKS_TTL_SECONDS = 3600.0
"""How long a worker's list of its blocks outlives its last claim or advertisement. Only its
bookkeeping: whether a worker is alive, and so holds anything, is its heartbeat's to say. A full
worker claims nothing for as long as its jobs run: its list must outlast them."""


class Claims:
    """This worker's claims (the queue loop's `Claim`) and what they carry."""

    def __init__(
        self,
        redis: aioredis.Redis,
        keys: Keys,
        settings: WorkerSettings,
        worker_id: str,
        prefix_cache: PrefixCache | None,
        running: Callable[[], int],
    ) -> None:
        """`redis`: where the blocks are told (the claims run on the queue loop's own connections);
        `running`: how many jobs this worker runs now."""
        self.redis = redis
        self.keys = keys
        self.model = keys.model(settings.model_name)
        self.worker_id = worker_id
        self.lease_seconds = settings.lease_seconds
        self.prefix_cache = prefix_cache if settings.prefix_aware_claiming else None
        wait = (
            settings.worker_poll_delay
            if settings.prefix_wait_seconds is None
            else settings.prefix_wait_seconds
        )
        # An idle worker claims every poll: a load older than a few polls is a full worker's.
        self.affinity = (
            None
            if self.prefix_cache is None
            else Affinity(
                window=AFFINITY_WINDOW,
                wait_seconds=wait,
                stale_seconds=3 * settings.worker_poll_delay,
                blocks_ttl_seconds=BLOCKS_TTL_SECONDS,
            )
        )
        self.running = running
        self._charges: list[tuple[str, int]] = []

    async def __call__(
        self, redis: aioredis.Redis, *, read_limit: int, wanted: int, batch_wanted: int
    ) -> list[tuple[str, int]]:
        charges, self._charges = self._charges, []
        try:
            return await claim(
                redis,
                keys=self.keys,
                model=self.model,
                worker_id=self.worker_id,
                lease_seconds=self.lease_seconds,
                read_limit=read_limit,
                wanted=wanted,
                batch_wanted=batch_wanted,
                charges=charges,
                affinity=self.affinity,
                running=self.running(),
            )
        except BaseException:
            self._charges[:0] = charges  # charged at the next claim that reaches Redis
            raise

    async def settle(self) -> None:
        """As the worker stops, after its last job: the output of the jobs it ended since its last
        claim is charged (a claim of nothing, which carries the charges), and its load leaves the
        workers' loads, where for a few polls it would still count as the least loaded."""
        await self(self.redis, read_limit=0, wanted=0, batch_wanted=0)
        if self.affinity is not None:
            await self.redis.hdel(self.model.worker_loads, self.worker_id)  # type: ignore[misc]

    def charge(self, job_id: str, output_tokens: int) -> None:
        """Count a run's output tokens against its job's share at the next claim."""
        if output_tokens > 0:
            self._charges.append((job_id, output_tokens))

    async def started(self, token_ids: list[int], adapter: str | None) -> None:
        """Tell that the engine's cache now holds the blocks of a prompt it starts."""
        if self.prefix_cache is None:
            return
        blocks = block_hashes(token_ids, self.prefix_cache.block_size, adapter)
        if blocks:
            await advertise(
                self.redis,
                model=self.model,
                worker_id=self.worker_id,
                blocks=blocks,
                capacity=self.prefix_cache.blocks,
                ttl_seconds=BLOCKS_TTL_SECONDS,
            )
