"""The arq worker: settings, start-up (engine, publisher, heartbeat, reaper, /health and /metrics) and
shutdown."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import os
import socket
import time
from typing import Any

import uvloop
from arq.connections import RedisSettings
from arq.worker import func

from shared.config import Settings
from shared.errors import BackendUnavailable
from shared.jobstore import ARQ_FUNCTION, JobStore
from shared.keys import Keys
from shared.redis_client import connect
from shared.workers import WorkerInfo
from worker.heartbeat import Heartbeat, new_worker_id
from worker.jobs import JobRunner, run_job
from worker.leases import Leases
from worker.metrics import MetricsServer, Readiness, WorkerMetrics
from worker.model_card import publish as publish_model_card
from worker.periodic import Periodic
from worker.publisher import Publisher
from worker.queue_worker import QueueWorker

log = logging.getLogger(__name__)

# Runs of a job are counted by the job store (`max_attempts`): arq must never give one up itself.
ARQ_MAX_TRIES = 1_000_000


def build_worker(settings: Settings) -> QueueWorker:
    """An arq worker that runs `settings.worker_max_jobs` jobs at once on one engine."""
    if settings.lease_seconds < 2 * settings.heartbeat_seconds:
        raise SystemExit(
            "lease_seconds must be at least twice heartbeat_seconds: heartbeats renew the leases"
        )
    keys = Keys(settings.key_prefix)
    worker_id = new_worker_id()
    started_at = time.time()
    metrics = WorkerMetrics()
    server = MetricsServer(metrics.registry, lambda: readiness(worker), settings.metrics_port)

    async def startup(ctx: dict[str, Any]) -> None:
        server.start()  # first: /health answers `starting` while the engine loads
        from worker.vllm_engine import VllmEngine  # heavy: only a worker pays for importing vLLM

        log.info("worker %s: starting the engine for %s", worker_id, settings.model)
        engine = VllmEngine(settings)
        redis = connect(
            settings.redis_url, keys.client_name(f"worker:{worker_id}"), settings.redis_max_connections
        )
        store = JobStore(redis, keys, settings)
        leases = Leases(store)
        publisher = Publisher(redis, store, worker_id)
        metrics.count_redis_round_trips(lambda: publisher.round_trips)
        runner = JobRunner(engine, store, publisher, leases, worker_id, lambda: worker.stopping, metrics)

        def describe() -> WorkerInfo:
            return WorkerInfo(
                worker_id=worker_id,
                model=engine.model_name,
                max_model_len=engine.max_model_len,
                running_jobs=runner.running,
                engine_requests=engine.running_requests(),
                started_at=started_at,
                heartbeat_at=time.time(),
                host=socket.gethostname(),
                pid=os.getpid(),
            )

        heartbeat = Heartbeat(redis, keys, describe, leases, runner.held, settings.heartbeat_ttl_seconds)
        await publish_model_card(redis, keys, settings.model, engine.model_name, engine.max_model_len)
        await heartbeat.beat()
        # Every worker reaps: a job whose worker died is released within half a lease of its lapse.
        periodic = [
            Periodic("heartbeat", heartbeat.beat, settings.heartbeat_seconds),
            Periodic("reaper", leases.reap, settings.lease_seconds / 2),
        ]
        for task in periodic:
            task.start()
        ctx.update(engine=engine, redis_client=redis, runner=runner, heartbeat=heartbeat, periodic=periodic)
        log.info(
            "worker %s ready: model %s, up to %d jobs at once",
            worker_id,
            engine.model_name,
            settings.worker_max_jobs,
        )

    async def shutdown(ctx: dict[str, Any]) -> None:
        for task in ctx.get("periodic", []):
            await task.stop()
        if "heartbeat" in ctx:
            with contextlib.suppress(BackendUnavailable):  # then its key expires by itself
                await ctx["heartbeat"].forget(worker_id)
        if "redis_client" in ctx:
            await ctx["redis_client"].aclose()
        if "engine" in ctx:
            ctx["engine"].shutdown()
        await server.close()  # last: /health says `draining` until the worker is gone
        log.info("worker %s stopped", worker_id)

    worker = QueueWorker(
        functions=[func(run_job, name=ARQ_FUNCTION)],
        queue_name=keys.queue,
        redis_settings=RedisSettings.from_dsn(settings.redis_url),
        max_jobs=settings.worker_max_jobs,
        poll_delay=settings.worker_poll_delay,
        job_timeout=settings.job_timeout_seconds,
        keep_result=0,
        max_tries=ARQ_MAX_TRIES,
        on_startup=startup,
        on_shutdown=shutdown,
        handle_signals=True,
        # On SIGTERM or SIGINT: no new jobs; running ones get this long, then hand themselves over.
        job_completion_wait=math.ceil(settings.drain_seconds),
        in_progress_seconds=settings.lease_seconds,
        wakeup_channel=keys.queue_wakeup,
    )
    return worker


def readiness(worker: QueueWorker) -> Readiness:
    """What the worker's /health says; start-up puts the job runner in arq's ctx as its last step."""
    if worker.stopping:
        return Readiness.draining
    if "runner" not in worker.ctx:
        return Readiness.starting
    return Readiness.redis_unreachable if worker.redis_down else Readiness.ready


def run(settings: Settings) -> None:
    # uvloop, as the gateway runs under uvicorn: each hop of a job's intake and of every engine
    # step's pipeline costs less. arq's worker takes the loop it finds set here.
    asyncio.set_event_loop(uvloop.new_event_loop())
    build_worker(settings).run()
