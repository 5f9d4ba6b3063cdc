"""The worker process: start-up (engine, then Redis, waited for; publisher, heartbeat, reaper, /health
and /metrics), its queue loop and shutdown."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import os
import socket
import time
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING

import redis.asyncio as aioredis
import uvloop

from shared.config import WorkerSettings
from shared.errors import BackendUnavailable
from shared.garbage import tune_garbage_collector
from shared.jobstore import JobStore
from shared.keys import Keys
from shared.lifecycle.transitions import claim, unclaim
from shared.model_card import ModelCard
from shared.queue import QueueWorker, queue_worker
from shared.redis_client import StreamsRedis, connect, connect_streams, connection_pool
from shared.workers import WorkerInfo
from worker import model_card
from worker.adapters import Adapters
from worker.engine import Engine
from worker.heartbeat import Heartbeat, new_worker_id
from worker.jobs import Ending, JobRunner
from worker.leases import Leases
from worker.metrics import MetricsServer, Readiness, WorkerMetrics, counted, kv_cache_usage
from worker.periodic import Periodic
from worker.publisher import Publisher
from worker.redis_wait import RedisWait
from worker.synthetic_engine import SyntheticEngine, read_model_card

if TYPE_CHECKING:
    from worker.replies import ReplyParsing

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class WorkerServices:
    """What a started worker runs on: built once, as start-up's last step; shutdown stops it."""

    engine: Engine
    redis: aioredis.Redis
    streams: StreamsRedis | None  # the streams' own Redis, when they have one
    runner: JobRunner
    heartbeat: Heartbeat
    periodic: list[Periodic]


class WorkerApp:
    """One worker: its queue loop, its /health and /metrics server, and its services once started."""

    def __init__(self, settings: WorkerSettings) -> None:
        if settings.lease_seconds < 2 * settings.heartbeat_seconds:
            raise SystemExit(
                "lease_seconds must be at least twice heartbeat_seconds: heartbeats renew the leases"
            )
        self.settings = settings
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
            claim=partial(
                claim,
                keys=self.keys,
                model=model,
                worker_id=self.worker_id,
                lease_seconds=settings.lease_seconds,
            ),
            unclaim=partial(unclaim, keys=self.keys, model=model, worker_id=self.worker_id),
            pool=connection_pool(
                settings.redis_url,
                self.keys.client_name(f"worker:{self.worker_id}:queue"),
                settings.redis_max_connections,
                sentinel_password=settings.redis_sentinel_password,
            ),
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
        settings, keys, worker_id = self.settings, self.keys, self.worker_id
        self.server.start()  # first: /health answers `starting` while the engine loads
        log.info("worker %s: starting the engine for %s (%s)", worker_id, settings.model, settings.engine)
        engine = start_engine(settings)
        redis = connect(
            settings.redis_url,
            keys.client_name(f"worker:{worker_id}"),
            settings.redis_max_connections,
            sentinel_password=settings.redis_sentinel_password,
        )
        streams = None
        if settings.streams_redis_url is not None:
            streams = connect_streams(
                settings.streams_redis_url,
                keys.client_name(f"worker:{worker_id}"),
                settings.redis_max_connections,
                sentinel_password=settings.redis_sentinel_password,
            )
        store = JobStore(redis, keys, settings, streams)
        leases = Leases(store, settings)
        publisher = Publisher(store.streams, store, worker_id, resend_seconds=settings.lease_seconds)
        self.metrics.count_redis_round_trips(lambda: publisher.round_trips)
        adapters = Adapters(engine, redis, keys, engine.model_name, settings.adapters)
        runner = JobRunner(
            engine,
            store,
            publisher,
            leases,
            worker_id,
            self.metrics,
            self.engine_died,
            adapters,
            reply_parsing(settings, engine),
        )

        def describe() -> WorkerInfo:
            return WorkerInfo(
                worker_id=worker_id,
                model=engine.model_name,
                aliases=settings.model_names[1:],
                adapters=list(adapters.given),
                adapter_paths={name: adapter.path for name, adapter in adapters.given.items()},
                runtime_adapters=adapters.loads(),
                max_model_len=engine.max_model_len,
                max_chars_per_token=engine.max_chars_per_token,
                dtype=engine.dtype,
                engine_args=engine.engine_arguments,
                running_jobs=runner.running,
                max_jobs=settings.worker_max_jobs,
                engine_requests=engine.running_requests(),
                generated_tokens=counted(self.metrics.generated_tokens),
                steps=publisher.round_trips,
                kv_cache_usage=kv_cache_usage(),
                draining=self.queue.stopping,
                started_at=self.started_at,
                heartbeat_at=time.time(),
                host=socket.gethostname(),
                pid=os.getpid(),
            )

        heartbeat = Heartbeat(redis, keys, describe, leases, runner.held, settings.heartbeat_ttl_seconds)

        async def register(card: ModelCard | None) -> None:
            """Start-up's reads and writes of Redis: the model card, the adapters loaded at run time, then
            the first heartbeat."""
            if card is not None:
                await model_card.publish(redis, keys, card)
            await adapters.sync()
            await heartbeat.beat()

        try:
            card = await engine_card(settings, engine)
            # Redis is first needed here, once the engine has loaded: a worker started before Redis
            # answers waits for it now, with its engine up, rather than exit and load it again.
            await self.redis_wait.run(partial(register, card))
        except BaseException:  # stopped (or given up) while waiting: no services yet for shutdown()
            await redis.aclose()
            if streams is not None:
                await streams.aclose()
            engine.shutdown()
            raise

        # Every worker reaps in turn: a job whose worker died is released within a lease of its lapse.
        async def watch_engine() -> None:  # an idle worker's engine may die too
            if engine.dead:
                self.engine_died()

        periodic = [
            Periodic("heartbeat", heartbeat.beat, settings.heartbeat_seconds),
            Periodic("reaper", partial(leases.reap, worker_id), leases.reap_every),
            Periodic("engine watch", watch_engine, settings.heartbeat_seconds),
            Periodic("adapters", adapters.sync, settings.heartbeat_seconds),
        ]
        for task in periodic:
            task.start()
        self.services = WorkerServices(engine, redis, streams, runner, heartbeat, periodic)
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

    async def run_job(self, job_id: str) -> bool:
        """The queue loop's entry point for a job: whether it is over (False: it is left for another run)."""
        if self.services is None:  # arq runs jobs only after start-up
            raise RuntimeError("a job came before the worker had started")
        return await self.services.runner.run(job_id) is Ending.ended

    async def shutdown(self) -> None:
        services = self.services
        if services is not None:
            for task in services.periodic:
                await task.stop()
            with contextlib.suppress(BackendUnavailable):  # then its key expires by itself
                await services.heartbeat.forget(self.worker_id)
            await services.redis.aclose()
            if services.streams is not None:
                await services.streams.aclose()
            services.engine.shutdown()
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


def start_engine(settings: WorkerSettings) -> Engine:
    """The engine `settings.engine` names; vLLM is imported only by a worker that runs it."""
    if settings.engine == "synthetic":
        card = read_model_card(settings.model, settings.model_name, settings.max_model_len)
        return SyntheticEngine(settings, card)
    from worker.vllm_engine import VllmEngine  # heavy: only a worker of the real engine pays for it

    return VllmEngine(settings)


def reply_parsing(settings: WorkerSettings, engine: Engine) -> ReplyParsing | None:
    """The pool's output parsers, where its flags ask for any (vLLM is then imported, by either engine):
    on the engine's own tokenizer where it has vLLM's."""
    if settings.auto_tool_parser is None and settings.reasoning_parser is None:
        return None
    from worker.replies import ReplyParsing  # heavy: imports vLLM

    return ReplyParsing(settings, getattr(engine, "tokenizer", None))


async def engine_card(settings: WorkerSettings, engine: Engine) -> ModelCard | None:
    """The card to publish: the synthetic engine's own, or one built as vLLM loads the tokenizer; with
    what the pool's parsers take and what its model serves (generation, pooling routes), so that
    gateways refuse what it cannot (vLLM's start-up flags)."""
    if isinstance(engine, SyntheticEngine):
        card: ModelCard | None = engine.card
    else:
        card = await model_card.build(settings.model, engine.model_name, engine.max_model_len)
    if card is None:
        return None
    serving = await engine.serving()
    return card.model_copy(
        update={
            "generates": serving.generates,
            "pooling_routes": serving.pooling_routes,
            "chat_template": engine.chat_template,
            "tool_call_parser": settings.auto_tool_parser,
            "reasoning_parser": settings.reasoning_parser,
            "trust_request_chat_template": settings.trust_request_chat_template,
        }
    )


def build_worker(settings: WorkerSettings) -> QueueWorker:
    """An arq worker that runs `settings.worker_max_jobs` jobs at once on one engine."""
    return WorkerApp(settings).queue


def run(settings: WorkerSettings) -> None:
    """Run a worker until a stop signal, or until its engine dies or it gave up waiting for Redis at
    start-up (`redis_startup_timeout_seconds`): then exit with status 1."""
    # uvloop, as the gateway runs under uvicorn: each hop of a job's intake and of every engine
    # step's pipeline costs less. arq's worker takes the loop it finds set here.
    asyncio.set_event_loop(uvloop.new_event_loop())
    worker = build_worker(settings)
    try:
        worker.run()
    except BackendUnavailable as exc:
        raise SystemExit(f"streampool worker: {exc.message}") from None
    if worker.failed:
        raise SystemExit("streampool worker: its engine died; start a new worker")
