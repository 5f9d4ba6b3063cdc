"""Admitting a job: the one path from a route's request to a queued job, whatever API it speaks.

A route converts its request into a `JobRequest` and passes the model its caller named;
admission resolves that name to a model's queue (an alias to its canonical name, an adapter to
its base model: `shared.models`), checks the job against the gateway's limits and the prompt
against that model's context, then submits it to that model's queue (idempotently, when a key
is given; within its key's tenant's limits, which the submit script checks in the same atomic
step) and counts what it accepted and refused. The route turns the exceptions raised here into
its own API's answers.

A known model (declared, or announced by a worker once) with no live worker queues its jobs, for
an autoscaler to start a worker; callers that wait for the output wait for that worker. Only
while no model is known at all, when nothing could ever run a job, is a job refused (503).

What admission reads of Redis besides the job itself (the live workers, the model registry,
Redis's memory) it reads at most once a second per gateway process and shares between requests:
a burst of submissions, or of unauthenticated /health calls, costs Redis a constant few commands
a second.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, replace
from typing import Generic, TypeVar

import redis.asyncio as aioredis
from redis.asyncio.cluster import RedisCluster

from gateway.compat.pooling import bounded_pooling
from gateway.metrics import GatewayMetrics
from gateway.prompt_limit import PromptLimit
from shared.batches import BatchLineJob
from shared.config import GatewaySettings
from shared.errors import BodyTooLarge, InvalidRequest, Overloaded, PromptTooLong, RateLimited
from shared.jobstore import JobStore, Submission, Turn, written_bytes
from shared.keys import Keys
from shared.model_card import ModelCard
from shared.models import Catalog, Target, read_registry
from shared.redis_client import StreamsRedis, redis_errors
from shared.requests import QUICK_TO_TOKENIZE_CHARS, JobRequest
from shared.scheduling import Placement
from shared.tenants import DEFAULT_SHARE, Tenant
from shared.workers import WorkerInfo, live_workers

log = logging.getLogger(__name__)

READ_EVERY_SECONDS = 1.0  # how stale the live workers and Redis's memory figures may be
T = TypeVar("T")


class Recent(Generic[T]):
    """The answer of `read`, read again once it is `max_age` seconds old; requests that ask while
    a read is under way wait for that one instead of sending their own. A failed read is not kept."""

    def __init__(self, read: Callable[[], Awaitable[T]], max_age: float = READ_EVERY_SECONDS) -> None:
        self.read = read
        self.max_age = max_age
        self._answer: tuple[float, T] | None = None
        self._lock = asyncio.Lock()

    def _fresh(self) -> T | None:
        if self._answer is None or time.monotonic() - self._answer[0] >= self.max_age:
            return None
        return self._answer[1]

    def forget(self) -> None:
        """Read again at the next `get`: what this gateway itself has just changed."""
        self._answer = None

    async def get(self) -> T:
        if (answer := self._fresh()) is not None:
            return answer
        async with self._lock:
            if (answer := self._fresh()) is not None:
                return answer
            value = await self.read()
            self._answer = (time.monotonic(), value)
            return value


@dataclass(frozen=True)
class Memory:
    """Redis's `INFO memory` figures that admission needs: bytes used, and the limit (0: none)."""

    used: int
    limit: int

    def share(self, adding: int = 0) -> float:
        """The share of `maxmemory` in use, with `adding` bytes more; 0 when Redis has no limit."""
        return (self.used + adding) / self.limit if self.limit else 0.0


async def fullest_memory(redis: aioredis.Redis, streams: StreamsRedis | None = None) -> Memory:
    """The memory of the fullest Redis a job writes to: `redis`, and `streams` (the job streams' own,
    every master of a Redis Cluster's) when they have one."""
    with redis_errors():
        readings = [await redis.info("memory")]
        if isinstance(streams, RedisCluster):
            readings += (await streams.info("memory", target_nodes=RedisCluster.PRIMARIES)).values()
        elif streams is not None:
            readings.append(await streams.info("memory"))
    memories = [Memory(int(info["used_memory"]), int(info["maxmemory"])) for info in readings]
    return max(memories, key=Memory.share)


def waiting_for(catalog: Catalog, model: str) -> str | None:
    """What a job of `model` waits for, when no live worker serves it: said in its `queued` event
    and its record."""
    if catalog.workers[model]:
        return None
    return f"waiting for a worker of model {model}: none is live"


def check_pool_serves(job: JobRequest, card: ModelCard | None) -> None:
    """`InvalidRequest`, in vLLM's words, for a chat its model's pool would refuse as `vllm serve` with
    the same flags refuses it: a tool choice with no tool-call parser to follow it, a chat template of
    the request's own where the pool does not trust one; a pooling request (`shared.pooling`) for a route
    its pool does not answer, or a generation for a pool that does not generate, naming what it serves.
    Without a card the worker checks."""
    if card is None:
        return
    if job.pooling is not None and job.pooling.route not in card.pooling_routes:
        raise InvalidRequest(
            f"model {card.model} does not answer {job.pooling.route} requests: {serves(card)}",
            param="model",
            code="model_not_supported",
        )
    if job.pooling is None and not card.generates:
        raise InvalidRequest(
            f"model {card.model} does not generate: {serves(card)}", param="model", code="model_not_supported"
        )
    if job.messages is None:
        return
    choice = job.effective_tool_choice
    if choice != "none" and card.tool_call_parser is None:
        if choice == "auto":
            message = '"auto" tool choice requires --enable-auto-tool-choice and --tool-call-parser to be set'
        else:
            named = f'"{choice}"' if isinstance(choice, str) else f'function "{choice.function.name}"'
            message = f"tool_choice={named} requires --tool-call-parser to be set"
        raise InvalidRequest(message, param="tool_choice", code="invalid_value")
    template_kwargs = job.chat_template_kwargs or {}
    own_template = job.chat_template is not None or template_kwargs.get("chat_template") is not None
    if own_template and not card.trust_request_chat_template:
        raise InvalidRequest(
            "Chat template is passed with request, but --trust-request-chat-template is not set. Refused "
            "request with untrusted chat template.",
            param="chat_template",
            code="invalid_value",
        )


def serves(card: ModelCard) -> str:
    """What a model's pool serves, in words, for a request it cannot."""
    served = [*(["generation"] if card.generates else []), *card.pooling_routes]
    if not served:
        return "its pool serves neither generation nor pooling requests"
    kind = "a generating model" if card.generates else "a pooling model (--runner pooling)"
    return f"it is {kind}, and serves {', '.join(served)}"


class Admission:
    """Checks, submits and counts every job this gateway queues."""

    def __init__(
        self,
        settings: GatewaySettings,
        redis: aioredis.Redis,
        keys: Keys,
        store: JobStore,
        prompt_limit: PromptLimit,
        metrics: GatewayMetrics,
        tenants: Mapping[str, Tenant],
    ) -> None:
        """`tenants`: by owner id, the tenant whose limits a caller's jobs must fit."""
        self.tenants = tenants
        self.max_tokens_limit = settings.max_tokens_limit
        self.max_choices = settings.max_choices
        self.max_prompts = settings.max_prompts
        self.max_pooling_inputs = settings.max_pooling_inputs
        self.max_pooling_tokens = settings.max_pooling_tokens
        self.max_queued_jobs = settings.max_queued_jobs
        self.default_queue_deadline = settings.default_queue_deadline_seconds
        self.share_by_tokens = settings.fair_share_unit == "tokens"
        self.memory_high_water = settings.redis_memory_high_water
        self.max_write_bytes = settings.max_request_write_bytes
        self.default_model = settings.default_model
        self.declared = [*settings.models, *([settings.default_model] if settings.default_model else [])]
        self.redis = redis
        self.keys = keys
        self.store = store
        self.prompt_limit = prompt_limit
        self.metrics = metrics
        self._workers = Recent(lambda: live_workers(redis, keys))
        self._registry = Recent(lambda: read_registry(redis, keys))
        self._memory = Recent(self._read_memory)

    async def live_workers(self) -> list[WorkerInfo]:
        """The workers with a live heartbeat, as read at most a second ago: what /health, the model
        list and every route that needs a worker go by."""
        return await self._workers.get()

    async def catalog(self) -> Catalog:
        """The models known now: the registry's, the declared ones and the live workers', each read
        at most a second ago."""
        workers = await self.live_workers()
        return Catalog(
            await self._registry.get(), self.declared, [worker.model_entry() for worker in workers]
        )

    def forget_catalog(self) -> None:
        """Read the registry again at the next request, after this gateway changed it (an adapter
        loaded or unloaded), so that its next requests see the change."""
        self._registry.forget()
        self._workers.forget()

    async def resolve(self, model: str | None) -> Target:
        """The model (and adapter) a request's `model` names; the default one for a request naming none."""
        return (await self.catalog()).resolve(model, self.default_model)

    async def waiting(self, model: str) -> str | None:
        """What a queued job of `model` waits for now, if no live worker serves it."""
        return waiting_for(await self.catalog(), model)

    async def _read_memory(self) -> Memory:
        return await fullest_memory(self.redis, self.store.streams_apart)

    async def check_memory(self, writing: int = 0) -> None:
        """`Overloaded` once Redis holds, with the `writing` bytes a submission is about to write, more
        than `redis_memory_high_water` of its `maxmemory`.

        The rest is kept for the jobs already running: with `noeviction` a full Redis refuses
        every write, and a job whose next step cannot be written stops streaming. New jobs wait
        until running ones end and retention frees their keys. Counting the write itself keeps one
        large submission admitted just below the mark from taking the rest.
        """
        memory = await self._memory.get()
        if memory.share(writing) >= self.memory_high_water:
            self.metrics.jobs_rejected.labels(reason="redis_memory").inc()
            raise Overloaded(
                f"Redis holds {memory.used} bytes, {memory.share():.0%} of its maxmemory "
                f"({memory.limit}); with the {writing} bytes this request writes it would hold "
                f"{memory.share(writing):.0%}, and new jobs are refused above {self.memory_high_water:.0%}"
            )

    def check_write(self, writing: int) -> None:
        """`BodyTooLarge` when a submission would write more than `max_request_write_bytes`."""
        if writing > self.max_write_bytes:
            self.metrics.jobs_rejected.labels(reason="body_too_large").inc()
            raise BodyTooLarge(
                f"this request would write {writing} bytes to Redis; one request may write at most "
                f"{self.max_write_bytes} (max_request_write_bytes)"
            )

    @staticmethod
    def priority(job: JobRequest, tenant: Tenant) -> int:
        """The job's priority: its own, or its tenant's default; never more urgent than the tenant may ask."""
        if job.priority is None:
            return tenant.default_priority
        if job.priority < tenant.min_priority:
            raise InvalidRequest.of_field(
                "priority",
                f"must be at least {tenant.min_priority} for tenant {tenant.name} (lower runs first)",
                detail=[{"loc": ["body", "priority"], "type": "greater_than_equal", "input": job.priority}],
            )
        return job.priority

    async def admit(
        self,
        job: JobRequest,
        owner: str,
        *,
        model: str | None = None,
        idempotency_key: str | None = None,
        annotations: Mapping[str, str] | None = None,
        fill_context: bool = False,
        turn: Turn | None = None,
        batch_line: BatchLineJob | None = None,
        deadline: float | None = None,
    ) -> Submission:
        """Queue `job` for `owner` on its model's queue, or raise why not (before anything is written).

        `model`: the model the caller named in its API's own field (else the job's `model`); none
        means the default model. The job carries it resolved (`Target.qualified`) to its worker.
        `annotations`: what the route's API keeps beside the job (`JobStore.annotations`).
        `fill_context`: the caller named no maximum, and its API's default is vLLM's (chat, Responses):
        the job may generate as many tokens as the model's context leaves, within `max_tokens_limit`.
        `turn`: the job is a turn of a conversation (`Turn`), `job` its own messages alone: the prompt
        checked is the whole conversation, what is written (and bounded by `max_request_write_bytes`,
        and counted against Redis's memory) is the turn's own.
        `batch_line`: the job is a batch's line: its id is derived from them (a second submission of the
        line answers the first's job), it waits in the batch band until the batch's window ends at the
        latest, and it takes only the room interactive work leaves in the model's queue (`submit.lua`).
        `deadline`: when the job, still queued, fails unrun (unix seconds: `gateway.deadlines`), where
        the job gives none; without either, `default_queue_deadline_seconds` from now, but for a
        batch's line, which waits for its window.
        """
        self.check_limits(job)
        catalog = await self.catalog()
        target = catalog.resolve(model if model is not None else job.model, self.default_model)
        job = job.model_copy(update={"model": target.qualified})
        check_pool_serves(job, await self.prompt_limit.card(target.model))
        placement = Placement()
        try:
            if job.pooling is not None:
                job = await self.bound_pooling(job, target.model)
            else:
                whole, placement = await self.prompt_limit.check(
                    turn.whole(job) if turn else job,
                    target.model,
                    catalog.entries.get(target.model),
                    fill=self.max_tokens_limit if fill_context else None,
                    adapter=target.adapter,
                )
                job = turn.own(whole) if turn else whole
        except PromptTooLong:
            self.metrics.jobs_rejected.labels(reason="prompt_too_long").inc()
            raise
        writing = written_bytes(job, annotations)
        self.check_write(writing)
        await self.check_memory(writing)
        tenant = self.tenants.get(owner)
        job = job.model_copy(update={"priority": self.priority(job, tenant or DEFAULT_SHARE)})
        try:
            submission = await self.store.submit(
                job,
                model=target.model,
                waiting=waiting_for(catalog, target.model),
                idempotency_key=idempotency_key,
                owner=owner,
                max_queued=self.max_queued_jobs,
                annotations=annotations,
                tenant=tenant,
                turn=turn,
                job_id=batch_line.job_id if batch_line else None,
                batch=batch_line.batch_id if batch_line else None,
                wait_until=batch_line.expires_at if batch_line else None,
                deadline=self._deadline(deadline, batch_line),
                placement=placement if self.share_by_tokens else replace(placement, prompt_tokens=None),
            )
        except RateLimited as exc:
            self.metrics.rejected_by_tenant(tenant.name if tenant else "", exc.detail["limit"])
            raise
        except Overloaded:
            self.metrics.jobs_rejected.labels(reason="overloaded").inc()
            raise
        if submission.created:
            self.metrics.jobs_submitted.inc()
            if tenant is not None:
                self.metrics.tenant_jobs_submitted.labels(tenant=tenant.name).inc()
            log.info("queued for %s", target.qualified, extra={"job_id": submission.job_id})
        return submission

    async def bound_pooling(self, job: JobRequest, model: str) -> JobRequest:
        """A pooling job within `max_pooling_inputs` and `max_pooling_tokens` (`bounded_pooling`), its
        inputs tokenized off the event loop unless they are few and short."""
        counter = await self.prompt_limit.counter(model)
        bound = functools.partial(
            bounded_pooling, job, model, counter, self.max_pooling_inputs, self.max_pooling_tokens
        )
        if counter is None or len(job.model_dump_json()) <= QUICK_TO_TOKENIZE_CHARS:
            return bound()
        return await asyncio.to_thread(bound)

    def _deadline(self, given: float | None, batch_line: BatchLineJob | None) -> float | None:
        """The deadline given beside the job, or the gateway's default from now (none for a batch's line)."""
        if given is not None or batch_line is not None or self.default_queue_deadline is None:
            return given
        return time.time() + self.default_queue_deadline

    def check_limits(self, job: JobRequest) -> None:
        """`InvalidRequest` naming the field when a job asks for more than the gateway's limits allow:
        tokens (a pooling job generates none), choices, prompts."""
        if job.pooling is None and job.max_tokens > self.max_tokens_limit:
            raise InvalidRequest.of_field(
                "max_tokens",
                f"must be at most {self.max_tokens_limit}",
                detail=[{"loc": ["body", "max_tokens"], "type": "less_than_equal", "input": job.max_tokens}],
            )
        if job.n > self.max_choices:
            raise InvalidRequest.of_field(
                "n",
                f"must be at most {self.max_choices}",
                detail=[{"loc": ["body", "n"], "type": "less_than_equal", "input": job.n}],
            )
        if job.prompt_count > self.max_prompts:
            field = "prompt" if job.prompt is not None else "prompt_token_ids"
            raise InvalidRequest.of_field(
                field,
                f"at most {self.max_prompts} prompts in one request, not {job.prompt_count}",
                detail=[{"loc": ["body", field], "type": "too_long", "input": job.prompt_count}],
            )
