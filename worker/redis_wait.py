"""A starting worker's wait for Redis, so that one started before Redis answers (not up yet, a
failover under way, Sentinels that do not answer yet) neither exits nor loads its engine twice.

It wraps the first writes the worker makes (its model card and first heartbeat), after the engine
has loaded: the load (tens of seconds to minutes) overlaps Redis's own start, and a Redis lost
during the load costs a wait, not another load. It retries those writes rather than a PING, as a
demoted master answers PING but refuses writes until its endpoint or the Sentinels name the new
one. The backoff is the gateway's stream reader's: 0.05 s, doubled up to 2 s.
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import Awaitable, Callable

from shared.errors import BackendUnavailable

log = logging.getLogger(__name__)

FIRST_RETRY_SECONDS = 0.05
LAST_RETRY_SECONDS = 2.0


class RedisWait:
    """Runs a start-up step until Redis takes it, for `timeout_seconds` at most (0: for ever)."""

    def __init__(self, timeout_seconds: float) -> None:
        self.timeout_seconds = timeout_seconds
        self.waiting = False
        """A try failed and the step has not gone through since: /health says `redis_unreachable`."""

    async def run(self, step: Callable[[], Awaitable[None]]) -> None:
        """`step` again until it does not raise `BackendUnavailable`, said once when the wait begins
        and once when it ends; past the timeout, that error, saying so. Cancelling (a stop signal)
        ends the wait at once."""
        loop = asyncio.get_running_loop()
        give_up_at = loop.time() + self.timeout_seconds if self.timeout_seconds else math.inf
        retry_in = FIRST_RETRY_SECONDS
        while True:
            try:
                await step()
            except BackendUnavailable as exc:
                left = give_up_at - loop.time()
                if left <= 0:
                    raise BackendUnavailable(
                        f"{exc.message} (waited {self.timeout_seconds:g} s at start-up: "
                        "redis_startup_timeout_seconds)"
                    ) from exc
                if not self.waiting:
                    log.warning(
                        "waiting for Redis before taking jobs, trying again up to every %g s (%s)",
                        LAST_RETRY_SECONDS,
                        exc.message,
                    )
                self.waiting = True
                await asyncio.sleep(min(retry_in, left))
                retry_in = min(2 * retry_in, LAST_RETRY_SECONDS)
            else:
                if self.waiting:
                    log.info("Redis answers; the worker goes on starting")
                self.waiting = False
                return
