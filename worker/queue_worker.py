"""arq's Worker, adapted to jobs that stream for a long time and can move between workers.

Two changes. A Redis outage pauses the poll loop instead of ending the process (arq lets
the first connection error end `main`, and so the worker). A stop signal always stops the
intake first, also with no drain time, so that running jobs know to hand themselves over
rather than fail when arq cancels them.
"""

from __future__ import annotations

import asyncio
import logging
from signal import Signals
from typing import Any

from arq.worker import Worker
from redis.exceptions import RedisError

log = logging.getLogger(__name__)

OUTAGE_RETRY_SECONDS = 0.5


class QueueWorker(Worker):
    def __init__(self, *args: Any, in_progress_seconds: float, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # arq marks a picked-up job for job_timeout + 10 s. Here the mark only has to last until
        # the job store's start takes the job's lease, and a short one cannot keep a queued job
        # blocked for an hour when its worker dies or loses Redis in that moment.
        self.in_progress_timeout_s = in_progress_seconds
        self._redis_down = False

    @property
    def stopping(self) -> bool:
        """A stop signal came: no new jobs; running ones finish within the drain time or are handed over."""
        return not self.allow_pick_jobs

    @property
    def redis_down(self) -> bool:
        """The last poll of the queue could not reach Redis: no jobs are taken until it answers."""
        return self._redis_down

    async def _poll_iteration(self) -> None:
        try:
            await super()._poll_iteration()
        except (RedisError, OSError) as exc:
            if not self._redis_down:
                log.warning("Redis is unreachable (%s); the worker waits for it", exc)
            self._redis_down = True
            await asyncio.sleep(OUTAGE_RETRY_SECONDS)
            return
        if self._redis_down:
            log.info("Redis answers again; taking jobs")
            self._redis_down = False

    def handle_sig(self, signum: Signals) -> None:
        self.allow_pick_jobs = False
        super().handle_sig(signum)
