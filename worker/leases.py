"""Leases of running jobs: renewed by their worker's heartbeat, released when the worker goes.

A worker that starts a job holds its lease (a key naming the worker, with a short TTL).
While the worker lives, its heartbeat renews the leases of all its jobs in one round trip.
When a lease lapses (the worker died, froze or lost Redis) or the worker hands a job back
(it is stopping), the job is released: put back into arq's queue, still `running` in its
record, for the next worker to resume from its stream; or failed with `worker_lost` once
it has run `max_attempts` times. Every write to a job checks the lease first, so a worker
that lost one can no longer touch the job.
"""

from __future__ import annotations

import itertools
import logging
import time

import redis.asyncio as aioredis

from shared.config import WorkerSettings
from shared.jobstore import JobStore
from shared.lifecycle.transitions import ReleaseOutcome
from shared.redis_client import redis_errors

log = logging.getLogger(__name__)

LAPSED = "its worker stopped renewing its lease (it died, froze or lost Redis)"
KEYS_EXTENDED_EVERY = 0.25
"""How often a running job's record and stream get a job lifetime again, in job lifetimes: a lease
is extended at every heartbeat, those keys, which outlast it by far, only now and then (extending
them at every heartbeat cost Redis twice the lease's own). A quarter, so that they outlive an
extension lost with its Redis (a failover's new master had not received it) twice over."""
LEASES_READ_AT_ONCE = 1000
"""Leases a reaper's MGET reads: enough that a command's own cost is shared out, few enough that no
one command holds Redis up for long."""
TURN_SHARE = 0.9
"""A reaper's turn lasts this share of the reaping interval: it is over before its holder's next look,
so that a look comes at least once an interval whoever holds the turn, and a holder that died holds
it for less than an interval."""


class Leases:
    """Renews, finds lapsed and releases the leases of running jobs."""

    def __init__(self, store: JobStore, settings: WorkerSettings) -> None:
        self.redis: aioredis.Redis = store.redis
        self.keys = store.keys
        self.store_settings = store.settings
        self.store = store
        self.lease_seconds = settings.lease_seconds
        self.reap_every = settings.lease_seconds / 2
        self.max_attempts = settings.max_attempts
        self.extended: dict[str, float] = {}  # job id -> when its keys were last extended (monotonic)

    async def renew(self, worker_id: str, job_ids: list[str]) -> list[str]:
        """Extend the leases `worker_id` holds on `job_ids`, and the keys of those of their jobs not
        extended for a while (`KEYS_EXTENDED_EVERY`; a job's keys must outlive its run); answers the
        jobs whose lease it lost. After a renewal that failed, every job's keys are extended again."""
        if not job_ids:
            self.extended = {}
            return []
        lifetime = self.store_settings.job_lifetime_seconds
        now = time.monotonic()
        since = now - lifetime * KEYS_EXTENDED_EVERY  # keys extended before this are due again
        due = [job_id for job_id in job_ids if self.extended.get(job_id, since) <= since]
        try:
            with redis_errors():
                lost = await self.store.renew(
                    worker_id, job_ids, lease_seconds=self.lease_seconds, extend=due
                )
        except Exception:
            self.extended = {}
            raise
        kept = set(job_ids).difference(lost)
        self.extended = {job_id: at for job_id, at in self.extended.items() if job_id in kept}
        self.extended.update((job_id, now) for job_id in due if job_id in kept)
        return lost

    async def lapsed(self) -> list[tuple[str, str]]:
        """Jobs started by some worker, not ended, whose lease has lapsed, each with its model (of any
        model: a job whose model has no worker left is requeued all the same, to wait for one).

        Every worker looks every half lease at every running job: their leases are read by MGETs of
        `LEASES_READ_AT_ONCE` (a lease is a string: a missing one reads as None), a command a slice
        rather than one a job, and only the lapsed jobs' models are read."""
        with redis_errors():
            job_ids = sorted(await self.redis.smembers(self.keys.running))  # type: ignore[misc]
            if not job_ids:
                return []
            leases = [self.keys.lease(job_id) for job_id in job_ids]
            async with self.redis.pipeline(transaction=False) as pipe:
                for start in range(0, len(leases), LEASES_READ_AT_ONCE):
                    pipe.mget(leases[start : start + LEASES_READ_AT_ONCE])
                holders = itertools.chain(*await pipe.execute())
            unheld = [job_id for job_id, holder in zip(job_ids, holders, strict=True) if holder is None]
            if not unheld:
                return []
            async with self.redis.pipeline(transaction=False) as pipe:
                for job_id in unheld:
                    pipe.hget(self.keys.job(job_id), "model")
                models = await pipe.execute()
        return [(job_id, model or "") for job_id, model in zip(unheld, models, strict=True)]

    async def release(
        self, job_id: str, model: str, reason: str, worker_id: str = "", attempt: int = 0
    ) -> ReleaseOutcome:
        """Requeue a running job of `model` for another worker to resume, or fail it once out of attempts.

        Without `worker_id`, only a lapsed lease is released (a reaper's call); with it, also
        that worker's own (a worker handing its job back), of the run `attempt` only: a run that
        gave up while Redis was away may find its job resumed, on this worker too, by then.
        """
        attempts = self.max_attempts
        message = f"{reason}; the job has run {attempts} time{'s' if attempts > 1 else ''} (max_attempts)"
        return await self.store.release(
            job_id, model, message, worker_id=worker_id, attempt=attempt, max_attempts=attempts
        )

    async def reap(self, worker_id: str) -> None:
        """Release every running job whose lease lapsed, when it is `worker_id`'s turn. Every worker
        asks every half lease (`reap_every`), and one a turn looks: every lease is read by one worker
        an interval rather than by each, whose cost would grow with workers times running jobs."""
        with redis_errors():
            turn = await self.redis.set(
                self.keys.reaper_turn, worker_id, nx=True, px=max(1, int(1000 * TURN_SHARE * self.reap_every))
            )
        if not turn:
            return
        for job_id, model in await self.lapsed():
            outcome = await self.release(job_id, model, LAPSED)
            if outcome in (ReleaseOutcome.requeued, ReleaseOutcome.failed):
                log.warning("job %s: its worker's lease lapsed; %s", job_id, outcome.value)
