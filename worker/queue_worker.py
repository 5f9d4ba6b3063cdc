"""arq's Worker, adapted to jobs that stream for a long time and can move between workers.

Four changes. An idle worker waits for a wake-up message (published with every enqueue)
instead of polling the queue every few milliseconds; the poll interval is only a backstop.
A poll reads the queue and claims the jobs it finds in one script (arq takes a round trip
for the read and four a job for the same checks). A Redis outage pauses the poll loop
instead of ending the process (arq lets the first connection error end `main`, and so
the worker). A stop signal always stops the intake first, also with no drain time, so that
running jobs know to hand themselves over rather than fail when arq cancels them.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from signal import Signals
from typing import Any

from arq.constants import in_progress_key_prefix
from arq.utils import timestamp_ms
from arq.worker import Worker
from redis.commands.core import AsyncScript
from redis.exceptions import RedisError

log = logging.getLogger(__name__)

OUTAGE_RETRY_SECONDS = 0.5

# KEYS: queue ; ARGV: now (ms), in-progress ms, in-progress key prefix, jobs to read, jobs wanted.
# arq's poll and its checks, in one call: the due jobs at the head of the queue, and of those the ones
# no other worker has taken (each then marked in progress), up to `wanted`. The in-progress keys are
# named here from arq's prefix: single-instance Redis, not Redis Cluster.
CLAIM_LUA = """
local due = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', ARGV[1], 'WITHSCORES', 'LIMIT', 0, ARGV[4])
local claimed = {}
for i = 1, #due, 2 do
  if #claimed >= 2 * tonumber(ARGV[5]) then break end
  local in_progress = ARGV[3] .. due[i]
  if redis.call('EXISTS', in_progress) == 0 then
    redis.call('PSETEX', in_progress, ARGV[2], '1')
    claimed[#claimed + 1] = due[i]
    claimed[#claimed + 1] = due[i + 1]
  end
end
return claimed
"""


class QueueWorker(Worker):
    def __init__(
        self, *args: Any, in_progress_seconds: float, wakeup_channel: str, poll_delay: float, **kwargs: Any
    ) -> None:
        # arq's own loop then sleeps no more between polls: `_wait_for_work` paces it.
        super().__init__(*args, poll_delay=0, **kwargs)
        self.idle_poll_seconds = poll_delay
        self.wakeup_channel = wakeup_channel
        self._wakeup = asyncio.Event()
        self._listener: asyncio.Task[None] | None = None
        self._claim: AsyncScript | None = None
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

    async def main(self) -> None:
        try:
            await super().main()
        finally:
            if self._listener is not None:
                self._listener.cancel()

    async def _poll_iteration(self) -> None:
        if self._listener is None:  # arq's pool exists from here on
            self._listener = asyncio.create_task(self._listen_for_wakeups(), name="queue-wakeups")
        self._wakeup.clear()  # a message during the poll below sets it again: none is missed
        try:
            await self._poll()
        except (RedisError, OSError) as exc:
            if not self._redis_down:
                log.warning("Redis is unreachable (%s); the worker waits for it", exc)
            self._redis_down = True
            await asyncio.sleep(OUTAGE_RETRY_SECONDS)
            return
        if self._redis_down:
            log.info("Redis answers again; taking jobs")
            self._redis_down = False
        await self._wait_for_work()

    async def _wait_for_work(self) -> None:
        """Until a wake-up message comes, or for `idle_poll_seconds` at most."""
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(self.idle_poll_seconds):
                await self._wakeup.wait()

    async def _listen_for_wakeups(self) -> None:
        """Set the wake-up event on every message; after a lost connection, resubscribe and poll once."""
        while True:
            try:
                async with self.pool.pubsub() as pubsub:
                    await pubsub.subscribe(self.wakeup_channel)
                    self._wakeup.set()  # jobs may have come while no subscription was listening
                    async for message in pubsub.listen():
                        if message["type"] == "message":
                            self._wakeup.set()
            except (RedisError, OSError):
                await asyncio.sleep(OUTAGE_RETRY_SECONDS)

    async def _poll(self) -> None:
        """arq's poll iteration (without burst mode or job aborts, which streampool does not use), with
        the queue read and the checks in one script: one round trip, where arq takes one for the read
        and four a job for the checks.

        arq polls only while a slot is free; a job that ends wakes the loop, so that a full worker
        takes the next queued job at once.
        """
        if self.allow_pick_jobs and self.job_counter < self.max_jobs:
            await self._claim_and_start()
        for job_id, task in list(self.tasks.items()):
            if task.done():
                del self.tasks[job_id]
                task.result()  # as arq does: a job's unexpected error surfaces here
        await self.heart_beat()

    async def _claim_and_start(self) -> None:
        if self._claim is None:
            self._claim = self.pool.register_script(CLAIM_LUA)
        claimed = await self._claim(
            keys=[self.queue_name],
            args=[
                timestamp_ms(),
                int(self.in_progress_timeout_s * 1000),
                in_progress_key_prefix,
                self.queue_read_limit,
                self.max_jobs - self.job_counter,
            ],
        )
        for job_id, score in zip(claimed[::2], claimed[1::2], strict=True):
            await self.sem.acquire()  # free: each claimed job had a free slot
            self.job_counter += 1
            task = self.loop.create_task(self.run_job(job_id.decode(), int(float(score))))
            task.add_done_callback(self._job_ended)
            self.tasks[job_id.decode()] = task

    def _job_ended(self, _: asyncio.Task[None]) -> None:
        self._release_sem_dec_counter_on_complete()
        self._wakeup.set()

    def handle_sig(self, signum: Signals) -> None:
        self.allow_pick_jobs = False
        super().handle_sig(signum)
