"""arq behind one door: its key names, its job serialization and its worker loop; no other module
imports arq. Written against arq 0.28.0 (pinned in pyproject.toml): the subclass below replaces
private parts of arq's `Worker`, which a new arq release may change.

The job store writes arq's job (its payload and queue entry) itself, inside its submit and
release scripts, so that enqueueing costs no extra round trip; hence arq's key names and
serialization are needed outside arq's own `enqueue_job`.

`QueueWorker` replaces six of arq's worker behaviours:
- start-up is left to `on_startup` alone, which waits for Redis (the worker's does, once its engine
  has loaded), where arq reads Redis's INFO first and a worker started before Redis answers ends
  there; and a worker stopped while Redis is down still runs `on_shutdown` and ends cleanly;
- an idle worker waits for a wake-up message (published with every enqueue) instead of polling
  the queue every few milliseconds; the poll interval is only a backstop;
- a poll reads the queue and claims the jobs it finds in one script (arq's `_poll_iteration`
  takes a round trip for the read and four a job for the same checks), which also picks them
  fairly among the tenants sharing the queue, where arq takes the oldest;
- a Redis outage pauses the poll loop instead of ending the process (arq lets the first
  connection error end `main`, and so the worker);
- a stop signal always stops the intake first, also with no drain time, so that running jobs
  know to hand themselves over rather than fail when arq cancels them;
- the worker can stop itself for good (`fail`: its engine died), as on a signal but marked
  failed, so that its process exits non-zero and its supervisor starts a new one.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
from collections.abc import Awaitable, Callable
from signal import SIGTERM, SIGUSR1, Signals
from typing import Any, Protocol

import redis.asyncio as aioredis
from arq.connections import ArqRedis
from arq.constants import in_progress_key_prefix, job_key_prefix, retry_key_prefix
from arq.jobs import serialize_job
from arq.worker import Retry, Worker, func
from redis.exceptions import RedisError

log = logging.getLogger(__name__)

JOB_FUNCTION = "run_job"
"""The one function name every queued job names."""
OUTAGE_RETRY_SECONDS = 0.5
# Runs of a job are counted by the job store (`max_attempts`): arq must never give one up itself.
MAX_TRIES = 1_000_000


def job_key(job_id: str) -> str:
    """arq's serialized job."""
    return job_key_prefix + job_id


def in_progress_key(job_id: str) -> str:
    """arq's marker of a job some worker has picked up; it keeps other workers from picking it too."""
    return in_progress_key_prefix + job_id


def retry_key(job_id: str) -> str:
    """arq's count of a job's tries."""
    return retry_key_prefix + job_id


def job_payload(job_id: str, enqueued_at: float) -> bytes:
    """arq's serialized job for `job_id`, as `enqueue_job` would write it."""
    return serialize_job(JOB_FUNCTION, (job_id,), {}, None, int(enqueued_at * 1000))


class Claim(Protocol):
    """The claim script (the job lifecycle's) for the worker's queue: jobs no other worker has
    taken, as (id, score)."""

    async def __call__(
        self,
        redis: aioredis.Redis,
        *,
        in_progress_ms: int,
        in_progress_prefix: str,
        read_limit: int,
        wanted: int,
    ) -> list[tuple[str, int]]: ...


RunJob = Callable[[str], Awaitable[bool]]
"""Runs one job; answers whether it is over. False leaves it in arq's queue: the job store has
requeued it (or a reaper will), and arq must neither finish it nor delete its payload."""


class QueueWorker(Worker):
    """arq's Worker with the intake described at the top of this module."""

    def __init__(
        self,
        *args: Any,
        claim: Claim,
        in_progress_seconds: float,
        wakeup_channel: str,
        poll_delay: float,
        **kwargs: Any,
    ) -> None:
        super().__init__(*args, **kwargs)
        self.claim = claim
        self.idle_poll_seconds = poll_delay
        self.wakeup_channel = wakeup_channel
        self._wakeup = asyncio.Event()
        self._listener: asyncio.Task[None] | None = None
        # arq marks a picked-up job for job_timeout + 10 s. Here the mark only has to last until
        # the job store's start takes the job's lease, and a short one cannot keep a queued job
        # blocked for an hour when its worker dies or loses Redis in that moment.
        self.in_progress_timeout_s = in_progress_seconds
        self._redis_down = False
        self._failed = False

    @property
    def stopping(self) -> bool:
        """A stop signal came: no new jobs; running ones finish within the drain time or are handed over."""
        return not self.allow_pick_jobs

    @property
    def failed(self) -> bool:
        """The worker stopped itself (`fail`): its process must exit non-zero."""
        return self._failed

    def fail(self) -> None:
        """Stop for good from inside: no new jobs from now on, then as on SIGTERM (running jobs get
        the drain time, then are cancelled and hand themselves over) and the worker ends. Idempotent."""
        if self._failed:
            return
        self._failed = True
        self.allow_pick_jobs = False
        self.loop.create_task(self._wait_for_tasks_to_complete(signum=SIGTERM))

    @property
    def redis_down(self) -> bool:
        """The last poll of the queue could not reach Redis: no jobs are taken until it answers."""
        return self._redis_down

    async def main(self) -> None:
        """arq's `main` without its Redis INFO before `on_startup`, nor what streampool does not use
        (a pool of arq's own: one is always given; burst mode). `_wait_for_work` paces the loop."""
        try:
            if self.on_startup is not None:
                await self.on_startup(self.ctx)
            while True:
                await self._poll_iteration()
        finally:
            if self._listener is not None:
                self._listener.cancel()

    async def close(self) -> None:
        """arq's `close`, but a Redis that does not answer (a stop during start-up's wait for it, or
        during an outage) keeps neither `on_shutdown` from running nor the process from ending
        cleanly: arq's health-check key expires by itself."""
        if not self._handle_signals:
            self.handle_sig(SIGUSR1)
        if self._pool is None:
            return
        await asyncio.gather(*self.tasks.values())
        with contextlib.suppress(RedisError, OSError):
            await self.pool.delete(self.health_check_key)
        if self.on_shutdown is not None:
            await self.on_shutdown(self.ctx)
        await self.pool.aclose(close_connection_pool=True)
        self._pool = None

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
        for job_id, task in list(self.tasks.items()):
            if task.done():
                del self.tasks[job_id]
                task.result()  # as arq does: a job's unexpected error surfaces here
        if self.allow_pick_jobs and self.job_counter < self.max_jobs:
            await self._claim_and_start()
        await self.heart_beat()

    async def _claim_and_start(self) -> None:
        claimed = await self.claim(
            self.pool,
            in_progress_ms=int(self.in_progress_timeout_s * 1000),
            in_progress_prefix=in_progress_key_prefix,
            read_limit=self.queue_read_limit,
            wanted=self.max_jobs - self.job_counter,
        )
        for job_id, score in claimed:
            if job_id in self.tasks:
                # An earlier run of this job has not ended here yet (its lease lapsed, and a reaper
                # requeued it meanwhile): arq keeps one task per job id, so the job stays queued, for
                # this worker once that run has gone or for another one now.
                await self.pool.delete(in_progress_key(job_id))
                continue
            await self.sem.acquire()  # free: each claimed job had a free slot
            self.job_counter += 1
            task = self.loop.create_task(self.run_job(job_id, score))
            task.add_done_callback(self._job_ended)
            self.tasks[job_id] = task

    def _job_ended(self, _: asyncio.Task[None]) -> None:
        self._release_sem_dec_counter_on_complete()
        self._wakeup.set()

    def handle_sig(self, signum: Signals) -> None:
        self.allow_pick_jobs = False
        super().handle_sig(signum)


def queue_worker(
    *,
    run: RunJob,
    claim: Claim,
    pool: aioredis.ConnectionPool,
    queue: str,
    wakeup_channel: str,
    max_jobs: int,
    poll_delay: float,
    job_timeout_seconds: int,
    in_progress_seconds: float,
    drain_seconds: float = 0,
    on_startup: Callable[[], Awaitable[None]] | None = None,
    on_shutdown: Callable[[], Awaitable[None]] | None = None,
    handle_signals: bool = True,
) -> QueueWorker:
    """A worker running `run` for each job of `queue`, `max_jobs` at once, on the connections of
    `pool` (`shared.redis_client.connection_pool`, answering bytes): arq's own pool would reach
    neither Sentinels with a password of their own nor a plain URL's master anew after a failover.

    On SIGTERM or SIGINT it takes no new jobs, gives running ones `drain_seconds`, then cancels them.
    """

    async def run_job(ctx: dict[str, Any], job_id: str) -> None:
        if not await run(job_id):
            # A retry without delay leaves the queue entry and the payload alone.
            raise Retry()

    async def startup(ctx: dict[str, Any]) -> None:
        if on_startup is not None:
            await on_startup()

    async def shutdown(ctx: dict[str, Any]) -> None:
        if on_shutdown is not None:
            await on_shutdown()

    return QueueWorker(
        functions=[func(run_job, name=JOB_FUNCTION)],
        queue_name=queue,
        redis_pool=ArqRedis(pool),
        max_jobs=max_jobs,
        poll_delay=poll_delay,
        job_timeout=job_timeout_seconds,
        keep_result=0,
        max_tries=MAX_TRIES,
        on_startup=startup,
        on_shutdown=shutdown,
        handle_signals=handle_signals,
        job_completion_wait=math.ceil(drain_seconds),
        claim=claim,
        in_progress_seconds=in_progress_seconds,
        wakeup_channel=wakeup_channel,
    )
