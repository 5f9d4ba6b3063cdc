"""What the console shows: the fleet, the queues, the tenants and the batches in one snapshot, and the
job list read from the job index.

The snapshot is read from Redis at most once a second per gateway process, however many consoles
poll it (`Recent`): the live workers and the catalog come from admission's own reads, then one
pipeline for the queues, one script per tenant and two reads per batch under way. Rates are not
stored anywhere: the workers' heartbeats carry counters since their start, which two snapshots diff.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from functools import partial

import redis.asyncio as aioredis
from pydantic import BaseModel

from gateway.admission import Recent
from gateway.deps import Services
from shared.errors import JobNotFound
from shared.events import JobState
from shared.keys import Keys
from shared.redis_client import redis_errors
from shared.tenants import Tenant, TenantUsage
from shared.workers import WorkerInfo

LISTS_KEPT = 32  # the job lists of this many filters are kept for a second each (the consoles' open ones)
HISTORY_POINTS = 600  # ten minutes of one-second snapshots: what a newly opened console draws at once
BATCHES_SHOWN = 20
JOB_FIELDS = ["status", "model", "tenant", "created_at", "started_at", "finished_at", "worker", "token_count"]
INDEX_PAGE = 200
INDEX_SCAN = 2000  # most index entries one listing reads: its cost is bounded whatever the filters


class WorkerRow(BaseModel):
    worker_id: str
    model: str
    host: str
    running_jobs: int
    max_jobs: int | None
    tokens_per_second: float | None  # None until two heartbeats of it were seen
    steps_per_second: float | None
    generated_tokens: int
    kv_cache_usage: float | None
    heartbeat_age: float  # seconds since its last heartbeat, by this gateway's clock
    draining: bool


class QueueRow(BaseModel):
    model: str
    workers: int
    queued: int
    batch_queued: int  # of `queued`, those in the batch band
    oldest_wait: float | None  # seconds the oldest queued job has waited


class TenantRow(BaseModel):
    name: str
    usage: TenantUsage
    limits: dict[str, int | None]


class BatchRow(BaseModel):
    id: str
    status: str
    endpoint: str
    total: int
    completed: int
    failed: int
    refused: int
    in_flight: int


class Point(BaseModel):
    at: float
    tokens_per_second: float
    queued: int


class Snapshot(BaseModel):
    at: float
    workers: list[WorkerRow]
    queues: list[QueueRow]
    tenants: list[TenantRow]
    batches: list[BatchRow]
    history: list[Point]


class JobRow(BaseModel):
    id: str
    status: JobState
    model: str | None
    tenant: str | None
    created_at: float
    started_at: float | None
    finished_at: float | None
    worker: str | None
    token_count: int | None  # an ended job's; a running one's is its record's (`GET /v1/jobs/{id}`)


@dataclass(frozen=True)
class JobFilter:
    """What a job list keeps: jobs in `state`, of `model`, of `tenant`, submitted at most `max_age` s
    ago (None: any), the newest `limit`."""

    state: JobState | None = None
    model: str | None = None
    tenant: str | None = None
    max_age: float | None = None
    limit: int = 50


class JobList(BaseModel):
    data: list[JobRow]
    scanned: int  # index entries read: at most `INDEX_SCAN`


class Rates:
    """Each worker's tokens and steps a second, from the counters of its last two heartbeats seen."""

    def __init__(self) -> None:
        self._last: dict[str, WorkerInfo] = {}
        self._rates: dict[str, tuple[float, float]] = {}

    def update(self, workers: Iterable[WorkerInfo]) -> dict[str, tuple[float, float]]:
        seen: dict[str, WorkerInfo] = {}
        for info in workers:
            seen[info.worker_id] = info
            before = self._last.get(info.worker_id)
            if before is not None and info.heartbeat_at > before.heartbeat_at:
                seconds = info.heartbeat_at - before.heartbeat_at
                self._rates[info.worker_id] = (
                    max(0, info.generated_tokens - before.generated_tokens) / seconds,
                    max(0, info.steps - before.steps) / seconds,
                )
            elif before is not None:
                seen[info.worker_id] = before  # the same heartbeat: diff the next one against the first
        self._last = seen
        self._rates = {worker_id: rate for worker_id, rate in self._rates.items() if worker_id in seen}
        return dict(self._rates)


class Console:
    """The snapshot every console of this gateway reads, and its recent history."""

    def __init__(self, services: Services, tenants: Mapping[str, Tenant]) -> None:
        self.services = services
        self.tenants = sorted({tenant.name: tenant for tenant in tenants.values()}.items())
        self.rates = Rates()
        self.history: deque[Point] = deque(maxlen=HISTORY_POINTS)
        self.snapshot = Recent(self._read)
        self._lists: dict[JobFilter, Recent[JobList]] = {}

    async def jobs(self, wanted: JobFilter) -> JobList:
        """The job list of `wanted`'s filters, as read at most a second ago: consoles that show the same
        filters share one read."""
        listed = self._lists.pop(wanted, None)
        if listed is None:
            services = self.services
            listed = Recent(partial(list_jobs, services.redis, services.keys, wanted))
        self._lists[wanted] = listed  # the newest last: the oldest goes first
        while len(self._lists) > LISTS_KEPT:
            del self._lists[next(iter(self._lists))]
        return await listed.get()

    async def _read(self) -> Snapshot:
        services, now = self.services, time.time()
        workers = await services.admission.live_workers()
        catalog = await services.admission.catalog()
        rates = self.rates.update(workers)
        rows = [
            WorkerRow(
                worker_id=info.worker_id,
                model=info.model,
                host=info.host,
                running_jobs=info.running_jobs,
                max_jobs=info.max_jobs,
                tokens_per_second=rates.get(info.worker_id, (None, None))[0],
                steps_per_second=rates.get(info.worker_id, (None, None))[1],
                generated_tokens=info.generated_tokens,
                kv_cache_usage=info.kv_cache_usage,
                heartbeat_age=max(0.0, now - info.heartbeat_at),
                draining=info.draining,
            )
            for info in workers
        ]
        queues = await queue_rows(services.redis, services.keys, catalog.entries, catalog.workers, now)
        tenants = [
            TenantRow(name=name, usage=await services.store.tenant_usage(name), limits=tenant.limits())
            for name, tenant in self.tenants
        ]
        self.history.append(
            Point(
                at=now,
                tokens_per_second=sum(row.tokens_per_second or 0 for row in rows),
                queued=sum(row.queued for row in queues),
            )
        )
        return Snapshot(
            at=now,
            workers=rows,
            queues=queues,
            tenants=tenants,
            batches=await self._batches(),
            history=list(self.history),
        )

    async def _batches(self) -> list[BatchRow]:
        rows = []
        for batch_id in (await self.services.batches.active())[:BATCHES_SHOWN]:
            fields = await self.services.batches.record(batch_id)
            progress = await self.services.batches.progress(batch_id)
            rows.append(
                BatchRow(
                    id=batch_id,
                    status=fields.get("status", ""),
                    endpoint=fields.get("endpoint", ""),
                    total=progress.total,
                    completed=progress.completed,
                    failed=progress.failed,
                    refused=progress.refused,
                    in_flight=progress.in_flight,
                )
            )
        return rows


async def queue_rows(
    redis: aioredis.Redis, keys: Keys, models: Iterable[str], workers: Mapping[str, int], now: float
) -> list[QueueRow]:
    """Each model's queue: its depth, its oldest job's wait (the queue is scored by submission ms) and
    the jobs in its batch band, in two round trips."""
    names = sorted(models)
    with redis_errors():
        async with redis.pipeline(transaction=False) as pipe:
            for name in names:
                model = keys.model(name)
                pipe.zcard(model.queue)
                pipe.zrange(model.queue, 0, 0, withscores=True)
                pipe.zrange(model.batch_share_tenants, 0, -1)
            answers = await pipe.execute()
        async with redis.pipeline(transaction=False) as pipe:
            for index, name in enumerate(names):
                for share in answers[3 * index + 2]:
                    pipe.zcard(keys.model(name).share_queue_prefix + share)
            band = iter(await pipe.execute())
    rows = []
    for index, name in enumerate(names):
        depth, oldest, shares = answers[3 * index : 3 * index + 3]
        rows.append(
            QueueRow(
                model=name,
                workers=workers.get(name, 0),
                queued=depth,
                batch_queued=sum(next(band) for _ in shares),
                oldest_wait=max(0.0, now - oldest[0][1] / 1000) if oldest else None,
            )
        )
    return rows


async def list_jobs(redis: aioredis.Redis, keys: Keys, wanted: JobFilter) -> JobList:
    """The newest jobs that match, newest first, from the job index (running ones from the set of
    running jobs, which holds them all however old); at most `INDEX_SCAN` entries are read, a page
    of ids and one pipeline of their records at a time. Ids whose record expired leave the index."""
    now = time.time()
    state, limit = wanted.state, wanted.limit
    oldest = "-inf" if wanted.max_age is None else int((now - wanted.max_age) * 1000)
    rows: list[JobRow] = []
    scanned = offset = 0  # entries read; where the next page starts (less the expired ones dropped)
    with redis_errors():
        running: list[str] | None = None
        if state is JobState.running:
            running = sorted(await redis.smembers(keys.running))  # type: ignore[misc]
        while len(rows) < limit and scanned < INDEX_SCAN:
            if running is not None:
                ids = running[offset : offset + INDEX_PAGE]
            else:
                ids = await redis.zrevrangebyscore(
                    keys.job_index, "+inf", oldest, start=offset, num=INDEX_PAGE
                )
            if not ids:
                break
            scanned += len(ids)
            offset += len(ids)
            async with redis.pipeline(transaction=False) as pipe:
                for job_id in ids:
                    pipe.hmget(keys.job(job_id), JOB_FIELDS)
                records = await pipe.execute()
            gone = [job_id for job_id, values in zip(ids, records, strict=True) if values[0] is None]
            if gone and running is None:
                await redis.zrem(keys.job_index, *gone)
                offset -= len(gone)
            for job_id, values in zip(ids, records, strict=True):
                row = _job_row(job_id, dict(zip(JOB_FIELDS, values, strict=True)))
                if row is not None and _matches(row, wanted, now):
                    rows.append(row)
    if running is not None:
        rows.sort(key=lambda row: row.created_at, reverse=True)
    return JobList(data=rows[:limit], scanned=scanned)


async def job_owner(redis: aioredis.Redis, keys: Keys, job_id: str) -> str:
    """The owner of any job, whose view of it the console takes (`JobNotFound` for no such job)."""
    with redis_errors():
        owner: str | None = await redis.hget(keys.job(job_id), "owner")  # type: ignore[misc]
    if owner is None:
        raise JobNotFound(f"no job {job_id}")
    return owner


def _job_row(job_id: str, fields: dict[str, str | None]) -> JobRow | None:
    if fields["status"] is None or fields["created_at"] is None:
        return None

    def seconds(name: str) -> float | None:
        value = fields[name]
        return float(value) if value else None

    token_count = fields["token_count"]
    return JobRow(
        id=job_id,
        status=JobState(fields["status"]),
        model=fields["model"],
        tenant=fields["tenant"],
        created_at=float(fields["created_at"]),
        started_at=seconds("started_at"),
        finished_at=seconds("finished_at"),
        worker=fields["worker"],
        token_count=int(token_count) if token_count else None,
    )


def _matches(row: JobRow, wanted: JobFilter, now: float) -> bool:
    return (
        (wanted.state is None or row.status is wanted.state)
        and (wanted.model is None or row.model == wanted.model)
        and (wanted.tenant is None or row.tenant == wanted.tenant)
        and (wanted.max_age is None or now - row.created_at <= wanted.max_age)
    )
