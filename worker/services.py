"""What a started worker runs on: its engine and Redis connections, the job runner, and the tasks
beside the jobs (heartbeat, reaper, engine watch, adapters). Built once, as start-up's last step;
shutdown stops it."""

from __future__ import annotations

import contextlib
import os
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING

from redis.exceptions import RedisError

from shared.config import WorkerSettings
from shared.connections import Connections
from shared.errors import BackendUnavailable
from shared.jobstore import JobStore
from shared.keys import Keys
from shared.model_card import ModelCard
from shared.workers import WorkerInfo
from worker import model_card
from worker.adapters import Adapters
from worker.claiming import Claims
from worker.engine import Engine
from worker.heartbeat import Heartbeat
from worker.jobs import JobRunner
from worker.leases import Leases
from worker.metrics import WorkerMetrics, counted, kv_cache_usage
from worker.periodic import Periodic
from worker.publisher import Publisher

if TYPE_CHECKING:
    from worker.replies import ReplyParsing


@dataclass(frozen=True)
class Identity:
    """Who the worker is, for its heartbeat: its id and settings, since when it runs, and whether it
    drains."""

    worker_id: str
    settings: WorkerSettings
    keys: Keys
    started_at: float
    draining: Callable[[], bool]


@dataclass(frozen=True)
class WorkerServices:
    """A started worker's parts: built on an engine already loaded, registered once Redis answers,
    then started; stopped by the worker's shutdown."""

    me: Identity
    engine: Engine
    connections: Connections
    runner: JobRunner
    claims: Claims
    adapters: Adapters
    heartbeat: Heartbeat
    periodic: list[Periodic]

    @classmethod
    def build(
        cls,
        me: Identity,
        engine: Engine,
        connections: Connections,
        metrics: WorkerMetrics,
        engine_died: Callable[[], None],
    ) -> WorkerServices:
        """The services of a worker on `engine` and `connections`; `engine_died` is told when a job
        or the watch finds the engine dead."""
        settings, redis = me.settings, connections.redis
        store = JobStore(redis, me.keys, settings, connections.streams)
        leases = Leases(store, settings)
        publisher = Publisher(store.streams, store, me.worker_id, resend_seconds=settings.lease_seconds)
        metrics.count_redis_round_trips(lambda: publisher.round_trips)
        adapters = Adapters(engine, redis, me.keys, engine.model_name, settings.adapters)
        claims = Claims(redis, me.keys, settings, me.worker_id, engine.prefix_cache, lambda: runner.running)
        runner = JobRunner(
            engine,
            store,
            publisher,
            leases,
            me.worker_id,
            metrics,
            engine_died,
            adapters,
            reply_parsing(settings, engine),
            claims,
        )

        def describe() -> WorkerInfo:
            return WorkerInfo(
                worker_id=me.worker_id,
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
                generated_tokens=counted(metrics.generated_tokens),
                steps=publisher.round_trips,
                kv_cache_usage=kv_cache_usage(),
                draining=me.draining(),
                started_at=me.started_at,
                heartbeat_at=time.time(),
                host=socket.gethostname(),
                pid=os.getpid(),
            )

        heartbeat = Heartbeat(redis, me.keys, describe, leases, runner.held, settings.heartbeat_ttl_seconds)

        async def watch_engine() -> None:  # an idle worker's engine may die too
            if engine.dead:
                engine_died()

        # Every worker reaps in turn: a job whose worker died is released within a lease of its lapse.
        periodic = [
            Periodic("heartbeat", heartbeat.beat, settings.heartbeat_seconds),
            Periodic("reaper", partial(leases.reap, me.worker_id), leases.reap_every),
            Periodic("engine watch", watch_engine, settings.heartbeat_seconds),
            Periodic("adapters", adapters.sync, settings.heartbeat_seconds),
        ]
        return cls(me, engine, connections, runner, claims, adapters, heartbeat, periodic)

    async def register(self, card: ModelCard | None) -> None:
        """Start-up's reads and writes of Redis: the model card, the adapters loaded at run time, then
        the first heartbeat."""
        if card is not None:
            await model_card.publish(self.connections.redis, self.me.keys, card)
        await self.adapters.sync()
        await self.heartbeat.beat()

    def start(self) -> None:
        for task in self.periodic:
            task.start()

    async def stop(self) -> None:
        """Stop the tasks, settle the claims, take the heartbeat away, close the connections and the
        engine."""
        for task in self.periodic:
            await task.stop()
        with contextlib.suppress(RedisError, OSError):  # then the last jobs' output goes uncharged
            await self.claims.settle()
        with contextlib.suppress(BackendUnavailable):  # then its key expires by itself
            await self.heartbeat.forget(self.me.worker_id)
        await self.close()

    async def close(self) -> None:
        """Close the connections and the engine (also of services never started)."""
        await self.connections.aclose()
        self.engine.shutdown()


def reply_parsing(settings: WorkerSettings, engine: Engine) -> ReplyParsing | None:
    """The pool's output parsers, where its flags ask for any (vLLM is then imported, by either engine):
    on the engine's own tokenizer where it has vLLM's."""
    if settings.auto_tool_parser is None and settings.reasoning_parser is None:
        return None
    from worker.replies import ReplyParsing  # heavy: imports vLLM

    return ReplyParsing(settings, getattr(engine, "tokenizer", None))
