"""The worker's queue loop: arq's `Worker`, with the project's intake. No other module imports arq
(an import-linter contract keeps the gateway and the client off both).

Each mechanism exists once:

- arq keeps the runs (its `tasks`, `max_jobs` at once), `on_startup` and `on_shutdown`, and the
  stop: on SIGTERM or SIGINT no new jobs, `job_completion_wait` seconds for the running ones, then
  they are cancelled (and hand themselves over).
- arq's queue is the model's sorted set (`ModelKeys.queue`, under the configured prefix): job ids
  scored by submission ms, written by the lifecycle scripts that queue a job (`enqueue.lua`).
- The project does the rest, and arq's own versions are not used, so arq writes no key of its own:
  - picking jobs: the claim script (`claim.lua`), fair among tenants, in one round trip, where arq
    reads the queue and checks each job in four;
  - holding a job: the job's lease, from the claim (`claim:<worker>`) through its run, where arq
    keeps an in-progress key; the job's run is the project's (`RunJob`), so arq's payload,
    in-progress, retry and result keys are never written;
  - counting runs: the record's `attempts` against `max_attempts`, where arq keeps a retry key;
  - time limits: a queued job's `deadline` (`start.lua`) and a running one's `job_timeout_seconds`
    (`worker.jobs`), where arq times a job out;
  - liveness: the worker's heartbeat (`worker.heartbeat`), where arq writes a health-check key.

`QueueWorker` is arq's `Worker` (0.28.0, pinned) with two of its methods replaced, and no more:
it reads none of arq's private attributes, and stops through arq's own signal handlers, drain
(`handle_sig_wait_for_completion`) and stop hook (`on_stop`). The two must stay, for what arq's own
would lose:

- `main`: arq's loop reads Redis (INFO) before `on_startup`, so a worker started before Redis
  answers ends there (the worker's start-up waits for Redis in `on_startup`, with its engine up);
  it takes jobs by ZRANGEBYSCORE and runs them through its own keys (payload, in-progress, retry,
  result), which the project's jobs do not have; any Redis error in a poll ends it (a Redis outage
  pauses the loop here instead); it polls every `poll_delay` (an idle worker waits here for a
  wake-up message, published with every enqueue); and it writes a health-check key each hour. None
  of these is a hook: the replaced loop runs `on_startup` as arq's does, then claims and runs its
  jobs itself (arq's `start_jobs` and `run_job` are never called).
- `close`: arq's deletes its health-check key before `on_shutdown` (with Redis down it raises, and
  `on_shutdown` never runs), and waits for the runs a stop cancelled as if each were an error.

It can also stop itself for good (`fail`: its engine died), as on a signal but marked failed, so
that its process exits non-zero and its supervisor starts a new one.
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
from arq.worker import Worker, func
from redis.exceptions import RedisError

log = logging.getLogger(__name__)

OUTAGE_RETRY_SECONDS = 0.5


class Claim(Protocol):
    """The claim script (the job lifecycle's) for the worker's model: up to `wanted` queued jobs no
    other worker holds (of them at most `batch_wanted` of batches), each now claimed by this one, as
    (id, score)."""

    async def __call__(
        self, redis: aioredis.Redis, *, read_limit: int, wanted: int, batch_wanted: int
    ) -> list[tuple[str, int]]: ...


class Unclaim(Protocol):
    """Let go of a claimed job this worker will not start (`unclaim.lua`)."""

    async def __call__(self, redis: aioredis.Redis, *, job_id: str) -> None: ...


RunJob = Callable[[str], Awaitable[bool]]
"""Runs one claimed job; answers whether it is over. False: the job was left for another run (not
started, handed back, or its lease lost), and a claim of it this worker still holds is let go of."""


class QueueWorker(Worker):
    """arq's Worker with the intake described at the top of this module."""

    def __init__(
        self,
        *args: Any,
        run: RunJob,
        claim: Claim,
        unclaim: Unclaim,
        wakeup_channel: str,
        batch_reserved: int = 0,
        handle_signals: bool = True,
        **kwargs: Any,
    ) -> None:
        super().__init__(*args, handle_signals=handle_signals, **kwargs)
        self.batch_reserved = batch_reserved
        self.run_claimed = run
        self.claim = claim
        self.unclaim = unclaim
        self.idle_poll_seconds = self.poll_delay_s
        self.wakeup_channel = wakeup_channel
        self.handles_signals = handle_signals
        self.on_stop = self._stop_intake  # arq's hook, at the end of every stop
        self._wakeup = asyncio.Event()
        self._listener: asyncio.Task[None] | None = None
        self._redis_down = False
        self._failed = False
        self._closed = False

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
        self.handle_sig_wait_for_completion(SIGTERM)

    @property
    def redis_down(self) -> bool:
        """The last poll of the queue could not reach Redis: no jobs are taken until it answers."""
        return self._redis_down

    async def main(self) -> None:
        """`on_startup`, then the intake until the worker stops (see the top of this module)."""
        try:
            if self.on_startup is not None:
                await self.on_startup(self.ctx)
            self._listener = asyncio.create_task(self._listen_for_wakeups(), name="queue-wakeups")
            while True:
                await self._take_jobs()
        finally:
            if self._listener is not None:
                self._listener.cancel()

    async def _run(self, job_id: str) -> None:
        """The project's run of a job this worker claimed (arq's `run_job` reads and writes keys of
        its own)."""
        if not await self.run_claimed(job_id):
            # Shielded: the stop that often comes with an unstarted job (`fail`) cancels the runs
            # still going, and a claim not let go of keeps the job from every worker until it lapses.
            with contextlib.suppress(RedisError, OSError):  # else the claim lapses by itself
                await asyncio.shield(self.unclaim(self.pool, job_id=job_id))

    async def close(self) -> None:
        """Wait for the running jobs, then `on_shutdown`, then close the connections."""
        if not self.handles_signals:
            self.handle_sig(SIGUSR1)  # as arq's: what a signal would have stopped
        if self._closed:
            return
        self._closed = True
        # The stop cancelled the jobs still running (they handed themselves over): their tasks end
        # cancelled, which is no error of the worker's.
        for ended in await asyncio.gather(*self.tasks.values(), return_exceptions=True):
            if isinstance(ended, Exception):
                log.error("a job's run failed", exc_info=ended)
        if self.on_shutdown is not None:
            await self.on_shutdown(self.ctx)
        await self.pool.aclose(close_connection_pool=True)

    def _stop_intake(self, _: Signals) -> None:
        """A stop always stops the intake, also with no drain time (where arq's stop leaves it)."""
        self.allow_pick_jobs = False

    async def _take_jobs(self) -> None:
        """One turn of the intake: claim what the free slots take, then wait for work."""
        self._wakeup.clear()  # a message during the claim below sets it again: none is missed
        try:
            for job_id, task in list(self.tasks.items()):
                if task.done():
                    del self.tasks[job_id]
                    task.result()  # as arq does: a job's unexpected error surfaces here
            if self.allow_pick_jobs and self.job_counter < self.max_jobs:
                await self._claim_and_start()
        except (RedisError, OSError) as exc:
            if not self._redis_down:
                log.warning("Redis is unreachable (%s); the worker waits for it", exc)
            self._redis_down = True
            await asyncio.sleep(OUTAGE_RETRY_SECONDS)
            return
        if self._redis_down:
            log.info("Redis answers again; taking jobs")
            self._redis_down = False
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

    async def _claim_and_start(self) -> None:
        # Batches' jobs take a free slot only while more than the reserved ones are free: whatever
        # runs, `batch_reserved` slots stay for interactive jobs (`shared.batches`).
        free = self.max_jobs - self.job_counter
        claimed = await self.claim(
            self.pool,
            read_limit=self.queue_read_limit,
            wanted=free,
            batch_wanted=max(0, free - self.batch_reserved),
        )
        for job_id, _ in claimed:
            if job_id in self.tasks:
                # An earlier run of this job has not ended here yet (its lease lapsed, and a reaper
                # requeued it meanwhile): one task a job id, so the job goes to another worker now,
                # or to this one once that run has gone.
                await self.unclaim(self.pool, job_id=job_id)
                continue
            self.job_counter += 1  # each claimed job had a free slot
            task = self.loop.create_task(self._run(job_id))
            task.add_done_callback(self._job_ended)
            self.tasks[job_id] = task

    def _job_ended(self, _: asyncio.Task[None]) -> None:
        """A slot is free: the intake looks for a job at once (a full worker does not poll)."""
        self.job_counter -= 1
        self._wakeup.set()


def queue_worker(
    *,
    run: RunJob,
    claim: Claim,
    unclaim: Unclaim,
    pool: aioredis.ConnectionPool,
    queue: str,
    wakeup_channel: str,
    max_jobs: int,
    poll_delay: float,
    batch_reserved: int = 0,
    drain_seconds: float = 0,
    on_startup: Callable[[], Awaitable[None]] | None = None,
    on_shutdown: Callable[[], Awaitable[None]] | None = None,
    handle_signals: bool = True,
) -> QueueWorker:
    """A worker running `run` for each job of `queue` it claims, `max_jobs` at once, on the
    connections of `pool` (`shared.redis_client.connection_pool`): arq's own pool would reach neither
    Sentinels with a password of their own nor a plain URL's master anew after a failover; of its
    slots, `batch_reserved` never run a batch's job. An idle
    worker looks at the queue on a message on `wakeup_channel`, or every `poll_delay` seconds.

    On SIGTERM or SIGINT it takes no new jobs, gives running ones `drain_seconds`, then cancels them.
    """

    async def startup(ctx: dict[str, Any]) -> None:
        if on_startup is not None:
            await on_startup()

    async def shutdown(ctx: dict[str, Any]) -> None:
        if on_shutdown is not None:
            await on_shutdown()

    async def unused(ctx: dict[str, Any]) -> None:
        """arq asks for a function; `QueueWorker` runs each job with `run` instead."""

    return QueueWorker(
        functions=[func(unused, name="run_job")],
        queue_name=queue,
        redis_pool=ArqRedis(pool),
        max_jobs=max_jobs,
        poll_delay=poll_delay,
        on_startup=startup,
        on_shutdown=shutdown,
        handle_signals=handle_signals,
        job_completion_wait=math.ceil(drain_seconds),
        run=run,
        claim=claim,
        unclaim=unclaim,
        wakeup_channel=wakeup_channel,
        batch_reserved=batch_reserved,
    )
