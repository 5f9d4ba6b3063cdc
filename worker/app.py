"""The arq worker: settings, start-up (engine, publisher, heartbeat) and shutdown."""

from __future__ import annotations

import logging
import os
import socket
import time
from typing import Any

from arq.connections import RedisSettings
from arq.worker import Worker, func

from shared.config import Settings
from shared.jobstore import ARQ_FUNCTION, JobStore
from shared.keys import Keys
from shared.redis_client import connect
from shared.workers import WorkerInfo
from worker.heartbeat import Heartbeat, new_worker_id
from worker.jobs import JobRunner, run_job
from worker.publisher import Publisher

log = logging.getLogger(__name__)


def build_worker(settings: Settings) -> Worker:
    """An arq `Worker` that runs `settings.worker_max_jobs` jobs at once on one engine."""
    keys = Keys(settings.key_prefix)
    worker_id = new_worker_id()
    started_at = time.time()

    async def startup(ctx: dict[str, Any]) -> None:
        from worker.vllm_engine import VllmEngine  # heavy: only a worker pays for importing vLLM

        log.info("worker %s: starting the engine for %s", worker_id, settings.model)
        engine = VllmEngine(settings)
        redis = connect(settings.redis_url)
        store = JobStore(redis, keys, settings)
        runner = JobRunner(engine, store, Publisher(redis, store), worker_id)

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

        heartbeat = Heartbeat(
            redis, keys, describe, settings.heartbeat_seconds, settings.heartbeat_ttl_seconds
        )
        await heartbeat.beat()
        heartbeat.start()
        ctx.update(engine=engine, redis_client=redis, runner=runner, heartbeat=heartbeat)
        log.info(
            "worker %s ready: model %s, up to %d jobs at once",
            worker_id,
            engine.model_name,
            settings.worker_max_jobs,
        )

    async def shutdown(ctx: dict[str, Any]) -> None:
        if "heartbeat" in ctx:
            await ctx["heartbeat"].stop(worker_id)
        if "redis_client" in ctx:
            await ctx["redis_client"].aclose()
        if "engine" in ctx:
            ctx["engine"].shutdown()
        log.info("worker %s stopped", worker_id)

    return Worker(
        functions=[func(run_job, name=ARQ_FUNCTION)],
        queue_name=keys.queue,
        redis_settings=RedisSettings.from_dsn(settings.redis_url),
        max_jobs=settings.worker_max_jobs,
        poll_delay=settings.worker_poll_delay,
        job_timeout=settings.job_timeout_seconds,
        keep_result=0,
        max_tries=1,
        on_startup=startup,
        on_shutdown=shutdown,
        handle_signals=True,
    )


def run(settings: Settings) -> None:
    build_worker(settings).run()
