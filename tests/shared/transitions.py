"""The lifecycle's transitions called as a worker calls them, for the tests that drive the job store."""

from __future__ import annotations

import time
from dataclasses import replace

from shared.jobstore import JobStore
from shared.lifecycle.claims import Affinity, claim
from shared.lifecycle.planes import planes_of
from shared.lifecycle.transitions import Failure, ReleaseOutcome, Transitions

MODEL = "smol"
WORKER = "worker-1"


def transitions(store: JobStore, **lifecycle: int) -> Transitions:
    """The lifecycle's transitions over the store's Redis and keys, as the store makes its own, with
    `lifecycle`'s values in place of its settings' (a stream's cap below what they allow, say); the
    store's fault hook between its two Redis goes with them."""
    changed = replace(store.planes.lifecycle, **lifecycle)
    planes = planes_of(store.redis, store.keys, changed, store.streams_apart)
    planes.between_planes = store.planes.between_planes
    return Transitions(store.redis, store.keys, changed, planes)


async def release(
    store: JobStore,
    job_id: str,
    *,
    attempt: int,
    failure: Failure | None = None,
    now: float | None = None,
    model: str = MODEL,
) -> ReleaseOutcome:
    """WORKER hands back its run `attempt` (of 3) of a job of `model` at `now` (by default, now), as a
    worker does whose engine died; `failure`: what the job fails with if it is out of attempts."""
    at = time.time() if now is None else now
    return await transitions(store, lifetime_seconds=60, retention_seconds=60, maxlen=1000).release(
        job_id=job_id,
        model=model,
        worker_id=WORKER,
        attempt=attempt,
        max_attempts=3,
        now=at,
        message="gone",
        failure=failure,
    )


async def claimed(
    store: JobStore,
    *,
    wanted: int = 1,
    read_limit: int = 100,
    worker: str = WORKER,
    model: str = MODEL,
    affinity: Affinity | None = None,
    running: int = 0,
) -> list[str]:
    """The jobs `worker`, a worker of `model` running `running` jobs, claims, as its queue loop does
    before it starts them (`affinity`: preferring the prefixes it holds)."""
    taken = await claim(
        store.redis,
        keys=store.keys,
        model=store.keys.model(model),
        worker_id=worker,
        lease_seconds=60,
        read_limit=read_limit,
        wanted=wanted,
        affinity=affinity,
        running=running,
    )
    return [job_id for job_id, _ in taken]


async def lose_last_entries(store: JobStore, job_id: str, count: int) -> None:
    """A stand-in for a failover whose new master had not received the job stream's last `count`
    entries: the stream as that master holds it, made anew without them (XDEL would leave the
    stream's last id where it was, which no new master does)."""
    stream = store.keys.stream(job_id)
    kept = (await store.redis.xrange(stream))[:-count]
    async with store.redis.pipeline(transaction=True) as pipe:
        pipe.delete(stream)
        for entry_id, fields in kept:
            pipe.xadd(stream, fields, id=entry_id)
        await pipe.execute()
