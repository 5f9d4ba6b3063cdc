"""The worker process: start-up (engine, then Redis, waited for; publisher, heartbeat, reaper, /health
and /metrics), its queue loop and shutdown."""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Callable
from functools import partial

import redis.asyncio as aioredis
import uvloop

from shared.config import WorkerSettings
from shared.connections import Connections, control_pool
from shared.errors import BackendUnavailable
from shared.garbage import tune_garbage_collector
from shared.keys import Keys
from shared.lifecycle.claims import unclaim
from worker.engine import Engine
from worker.heartbeat import new_worker_id
from worker.jobs import Ending
from worker.metrics import MetricsServer, Readiness, WorkerMetrics
from worker.model_card import engine_card
from worker.queue import queue_worker
from worker.redis_wait import RedisWait
from worker.services import Identity, WorkerServices

EngineStarter = Callable[[WorkerSettings], Engine]
"""Starts the engine the settings name (chosen by the command that runs the worker, `cli.engines`)."""

log = logging.getLogger(__name__)


class WorkerApp:
    """One worker: its queue loop, its /health and /metrics server, and its services once started."""

    def __init__(self, settings: WorkerSettings, start_engine: EngineStarter) -> None:
        if settings.lease_seconds < 2 * settings.heartbeat_seconds:
            raise SystemExit(
                "lease_seconds must be at least twice heartbeat_seconds: heartbeats renew the leases"
            )
        self.settings = settings
        self.start_engine = start_engine
        self.keys = Keys.of(settings)
        self.worker_id = new_worker_id()
        self.started_at = time.time()
        self.metrics = WorkerMetrics(settings.model_name)
        model = self.keys.model(settings.model_name)
        self.server = MetricsServer(
            self.metrics.registry, self.readiness, settings.metrics_port, settings.metrics_host
        )
        self.services: WorkerServices | None = None
        self.redis_wait = RedisWait(settings.redis_startup_timeout_seconds)
        self.queue = queue_worker(
            run=self.run_job,
            claim=self.claim_jobs,
            unclaim=partial(unclaim, keys=self.keys, model=model, worker_id=self.worker_id),
            pool=control_pool(settings, self.keys.client_name(f"worker:{self.worker_id}:queue")),
            # One engine, one model: the worker takes only its model's jobs.
            queue=model.queue,
            wakeup_channel=model.wakeup,
            max_jobs=settings.worker_max_jobs,
            poll_delay=settings.worker_poll_delay,
            batch_reserved=math.ceil(settings.worker_max_jobs * settings.batch_reserved_share),
            # On SIGTERM or SIGINT: no new jobs; running ones get this long, then hand themselves over.
            drain_seconds=settings.drain_seconds,
            on_startup=self.startup,
            on_shutdown=self.shutdown,
        )

    async def startup(self) -> None:
        """The engine first (/health says `starting` while it loads), then Redis, waited for; then the
        tasks beside the jobs."""
        settings, worker_id = self.settings, self.worker_id
        self.server.start()
        log.info("worker %s: starting the engine for %s (%s)", worker_id, settings.model, settings.engine)
        engine = self.start_engine(settings)
        connections = Connections.open(settings, self.keys.client_name(f"worker:{worker_id}"))
        me = Identity(worker_id, settings, self.keys, self.started_at, lambda: self.queue.stopping)
        services = WorkerServices.build(me, engine, connections, self.metrics, self.engine_died)
        try:
            card = await engine_card(settings, engine)
            # Redis is first needed here, once the engine has loaded: a worker started before Redis
            # answers waits for it now, with its engine up, rather than exit and load it again.
            await self.redis_wait.run(partial(services.register, card))
        except BaseException:  # stopped (or given up) while waiting: no services yet for shutdown()
            await services.close()
            raise
        services.start()
        self.services = services
        tune_garbage_collector()  # once the engine is up: what loading it made lives as long as the worker
        log.info(
            "worker %s ready: model %s (%s), up to %d jobs at once",
            worker_id,
            engine.model_name,
            engine.dtype,
            settings.worker_max_jobs,
        )

    def engine_died(self) -> None:
        """The engine is gone for good: take no more jobs, hand the running ones back, and exit
        non-zero so that the supervisor (compose, Kubernetes, `streampool up`) starts a new worker."""
        if not self.queue.failed:
            log.error("worker %s: the engine died; taking no more jobs and exiting", self.worker_id)
        self.queue.fail()

    async def claim_jobs(
        self, redis: aioredis.Redis, *, read_limit: int, wanted: int, batch_wanted: int
    ) -> list[tuple[str, int]]:
        """The queue loop's claims: the started worker's (`worker.claiming`), which know its cache."""
        if self.services is None:  # arq claims only after start-up
            return []
        return await self.services.claims(
            redis, read_limit=read_limit, wanted=wanted, batch_wanted=batch_wanted
        )

    async def run_job(self, job_id: str) -> bool:
        """The queue loop's entry point for a job: whether it is over (False: it is left for another run)."""
        if self.services is None:  # arq runs jobs only after start-up
            raise RuntimeError("a job came before the worker had started")
        return await self.services.runner.run(job_id) is Ending.ended

    async def shutdown(self) -> None:
        if self.services is not None:
            await self.services.stop()
        await self.server.close()  # last: /health says `draining` until the worker is gone
        log.info("worker %s stopped", self.worker_id)

    def readiness(self) -> Readiness:
        """What the worker's /health says."""
        if self.queue.failed:
            return Readiness.engine_dead
        if self.queue.stopping:
            return Readiness.draining
        if self.services is None:
            return Readiness.redis_unreachable if self.redis_wait.waiting else Readiness.starting
        return Readiness.redis_unreachable if self.queue.redis_down else Readiness.ready


def run(settings: WorkerSettings, start_engine: EngineStarter) -> None:
    """Run a worker of the engine `start_engine` starts, `settings.worker_max_jobs` jobs at once, until
    a stop signal, or until its engine dies or it gave up waiting for Redis at start-up
    (`redis_startup_timeout_seconds`): then exit with status 1."""
    # uvloop, as the gateway runs under uvicorn: each hop of a job's intake and of every engine
    # step's pipeline costs less. arq's worker takes the loop it finds set here.
    asyncio.set_event_loop(uvloop.new_event_loop())
    worker = WorkerApp(settings, start_engine).queue
    try:
        worker.run()
    except BackendUnavailable as exc:
        raise SystemExit(f"streampool worker: {exc.message}") from None
    if worker.failed:
        raise SystemExit("streampool worker: its engine died; start a new worker")
