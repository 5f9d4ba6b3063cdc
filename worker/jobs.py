"""A job's run on this worker: start or resume it, drive the engine, publish each step, end with one
terminal event.
A job this worker cannot finish is left to another: handed back when the worker stops, loses
Redis or its engine dies, or given up when another worker took it over (its lease lapsed). The next
worker resumes it from the tokens its stream holds, so readers see one unbroken stream.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from contextlib import aclosing
from dataclasses import replace
from enum import Enum
from typing import TYPE_CHECKING, Any

from shared.errors import (
    BackendUnavailable,
    EngineDead,
    EngineError,
    NotResumable,
    PromptTooLong,
    StreampoolError,
)
from shared.events import Event, JobState
from shared.jobstore import JobStore, Outcome, Started
from shared.lifecycle.transitions import FinishOutcome, Verdict
from shared.logs import job_context
from shared.models import Target
from shared.pooling import PoolingJob, usage_prompt_tokens
from shared.requests import JobRequest
from worker.adapters import Adapters
from worker.chunker import Chunker
from worker.claiming import Claims
from worker.engine import Engine, Prompt, Serving, abort, generate, render
from worker.leases import Leases
from worker.metrics import RunClock, WorkerMetrics
from worker.publisher import Publisher

if TYPE_CHECKING:  # imports vLLM: only a worker whose pool parses output has one
    from worker.replies import Reply, ReplyParsing

log = logging.getLogger(__name__)

HAND_BACK_RETRY_SECONDS = 0.5
POOLING_CHECK_SECONDS = 0.5
"""How often a pooling job, which has no steps of its own, checks its cancel key and lease meanwhile."""


class StreamBehind(Exception):
    """The job's stream lacks events this run wrote (a Redis failover lost them) that the publisher
    no longer keeps: the job goes on from what the stream holds, handed back like a crashed run's."""


class Ending(Enum):
    """How a run ended for this worker."""

    ended = "ended"  # the job reached a terminal state (here, or before this run could start)
    left = "left"  # handed back or taken over: another worker resumes it


class JobRunner:
    """Runs one job per call; a worker runs hundreds of calls at once so vLLM batches them."""

    def __init__(
        self,
        engine: Engine,
        store: JobStore,
        publisher: Publisher,
        leases: Leases,
        worker_id: str,
        metrics: WorkerMetrics,
        engine_died: Callable[[], None],
        adapters: Adapters,
        replies: ReplyParsing | None = None,
        claims: Claims | None = None,
    ) -> None:
        self.engine = engine
        self.claims = claims
        """This worker's claims, told of the prompts it starts and the tokens its jobs generate."""
        self.adapters = adapters
        """The LoRA adapters its jobs may name."""
        self.replies = replies
        """The pool's output parsers (tool calls, reasoning), if it has any."""
        self.store = store
        self.publisher = publisher
        self.leases = leases
        self.worker_id = worker_id
        self.metrics = metrics
        self.engine_died = engine_died
        """Called when a run finds the engine dead: the worker takes no more jobs, and goes."""
        self.jobs: dict[str, RunClock] = {}
        """The jobs this worker runs, each with the clock of its run."""
        metrics.jobs_running.set_function(lambda: len(self.jobs))

    @property
    def running(self) -> int:
        return len(self.jobs)

    def held(self) -> list[str]:
        """The jobs whose leases this worker holds, for its heartbeat to renew."""
        return list(self.jobs)

    async def run(self, job_id: str) -> Ending:
        with job_context(job_id):
            if self.engine.dead:  # the job stays queued, for another worker: this one is going
                self.engine_died()
                return Ending.left
            try:
                started = await self.store.start(
                    job_id, self.worker_id, self.engine.model_name, lease_seconds=self.leases.lease_seconds
                )
            except BackendUnavailable as exc:
                log.warning("not started: %s", exc.message)
                return Ending.left
            if started is None:
                log.info("not started: cancelled, past its deadline, or held by another worker")
                return Ending.ended
            self.jobs[job_id] = RunClock(self.metrics, started)
            try:
                return await self._run_started(job_id, started)
            finally:
                self.jobs.pop(job_id, None)
                self.publisher.forget(job_id)

    async def _run_started(self, job_id: str, started: Started) -> Ending:
        chunker = Chunker.after(started.progress, started.request.stream_step, started.request.choices)
        earlier = chunker.completion_tokens  # what earlier runs of a resumed job generated
        try:
            return await self._run_guarded(job_id, started, chunker)
        except BackendUnavailable as exc:
            # What the last write did is unknown; the stream is the truth the next run resumes from.
            log.warning("Redis is unreachable (%s); handing the job back", exc.message)
            return await self._hand_back(job_id, started, "its worker lost Redis")
        except StreamBehind:
            log.warning("a Redis failover lost the job's last events; handing the job back")
            return await self._hand_back(job_id, started, "a Redis failover lost its last events")
        finally:
            if self.claims is not None:
                self.claims.charge(job_id, chunker.completion_tokens - earlier)

    async def _run_guarded(self, job_id: str, started: Started, chunker: Chunker) -> Ending:
        """Run the job; a failure ends it with an `error` event, a stop signal hands it back."""
        time_limit = asyncio.timeout(self.store.settings.job_timeout_seconds)
        try:
            async with time_limit:
                return await self._generate(job_id, started, chunker)
        except (BackendUnavailable, StreamBehind):
            raise
        except EngineDead as exc:
            # No fault of the job's: it goes on on another worker, from the tokens its stream holds.
            log.error("%s; handing the job back", exc.message)
            self.engine_died()
            return await self._hand_back(job_id, started, "its worker's engine died")
        except StreampoolError as exc:
            return await self._fail(job_id, chunker, exc.message, exc.error_type)
        except asyncio.CancelledError:
            # The queue loop cancels running jobs once the worker's drain time is over.
            await asyncio.shield(self._hand_back(job_id, started, "its worker shut down"))
            raise
        except Exception as exc:
            if isinstance(exc, TimeoutError) and time_limit.expired():  # the engine request is aborted
                return await self._fail(
                    job_id, chunker, "the job ran longer than job_timeout_seconds", "timeout"
                )
            log.exception("job crashed")
            return await self._fail(job_id, chunker, f"internal error: {exc!r}", "internal")

    async def _generate(self, job_id: str, started: Started, chunker: Chunker) -> Ending:
        request = started.request
        serving = await self.engine.serving()
        if request.pooling is not None:
            return await self._pool(job_id, started, chunker, request.pooling, serving)
        if not serving.generates:
            raise EngineError(f"{self.engine.model_name} does not generate: it serves {serving.describe()}")
        if started.resumed and request.choices > 1:
            raise NotResumable(
                f"a job of {request.choices} choices cannot resume: its choices cannot go on "
                "token-exactly from its stream; submit it again"
            )
        prompts = await render(self.engine, await self.store.whole_request(started))
        chunker.prompt_tokens = sum(len(prompt.token_ids) for prompt in prompts)
        for prompt in prompts:
            self._check_fits(prompt)
        reply = self._reply(request, prompts)
        if reply is not None:
            prompts = [replace(prompts[0], engine_options=reply.engine_options)]  # a chat: one prompt
        async with self.adapters.using(
            Target.of_job(request.model, self.engine.model_name).adapter
        ) as adapter:
            if adapter is not None:
                prompts = [replace(prompt, adapter=adapter) for prompt in prompts]
            if self.claims is not None:
                await self.claims.started(prompts[0].token_ids, None if adapter is None else adapter.name)
            return await self._run_prompts(job_id, started, chunker, prompts, reply)

    async def _run_prompts(
        self, job_id: str, started: Started, chunker: Chunker, prompts: list[Prompt], reply: Reply | None
    ) -> Ending:
        """Generate from the job's prompts, after the tokens its earlier runs emitted, if any."""
        request = started.request
        if started.resumed:
            self.metrics.resumes.inc()
            emitted = started.progress.token_ids
            log.info("resuming (attempt %d) after %d tokens", started.attempt, len(emitted))
            message = f"resumed by worker {self.worker_id} after {len(emitted)} tokens"
            verdict = await self.publisher.step(job_id, chunker.resumed(started.attempt, message))
            if verdict is not Verdict.go:
                return await self._stop(job_id, chunker, verdict, len(prompts))
            prompts = [prompts[0].continued(emitted)]  # a job of one choice: one prompt
            if reply is not None:
                reply.resumed(emitted)
        else:
            log.info("running: %d prompt tokens, max_tokens %d", chunker.prompt_tokens, request.max_tokens)
        clock = self.jobs[job_id]
        async with aclosing(generate(self.engine, job_id, prompts)) as deltas:
            async for engine_delta in deltas:
                delta = engine_delta if reply is None else reply.parse(engine_delta)
                clock.output(len(delta.token_ids))
                events = chunker.feed(delta)
                if delta.finished and chunker.finished:  # only a choice's last delta can end the job
                    return await self._complete(job_id, chunker, events)
                verdict = await self.publisher.step(job_id, events)
                if verdict is not Verdict.go:
                    return await self._stop(job_id, chunker, verdict, len(prompts))
        raise EngineError("the engine ended the request without finishing it")

    async def _pool(
        self, job_id: str, started: Started, chunker: Chunker, job: PoolingJob, serving: Serving
    ) -> Ending:
        """A pooling job: its whole answer in its `done` event. A job whose last run's worker was lost
        runs again from the start: nothing of an answer is written before all of it."""
        model = self.engine.model_name
        if job.route not in serving.pooling_routes:  # its pool's card said otherwise when it was admitted
            message = f"{model} does not serve /{job.route}: it serves {serving.describe()}"
            return await self._fail(job_id, chunker, message, "BadRequestError")
        adapter = Target.of_job(started.request.model, model).adapter
        if adapter is not None:  # rather than its base model's answer, as if the adapter's
            message = f"{model} answers /{job.route} with its base model alone, not with adapter {adapter}"
            return await self._fail(job_id, chunker, message, "BadRequestError")
        if started.resumed:
            self.metrics.resumes.inc()
            message = f"run again by worker {self.worker_id}"
            verdict = await self.publisher.step(job_id, chunker.resumed(started.attempt, message))
            if verdict is not Verdict.go:
                return await self._stop(job_id, chunker, verdict, 1)
        log.info("pooling: /%s, %d inputs", job.route, job.inputs)
        try:
            result = await self._pooled(job_id, job)
        except EngineError as exc:  # vLLM's refusal: its type is the code, for the status vLLM answers
            return await self._fail(job_id, chunker, exc.message, exc.detail.get("code") or exc.error_type)
        if isinstance(result, Verdict):
            return await self._stop(job_id, chunker, result, 1)
        chunker.prompt_tokens = usage_prompt_tokens(result)
        return await self._end(
            job_id, chunker, chunker.pooled(result), JobState.completed, "stop", result=result
        )

    async def _pooled(self, job_id: str, job: PoolingJob) -> dict[str, Any] | Verdict:
        """The engine's answer; or, where a check made meanwhile (as a generation's steps check) says
        the job may not go on (cancelled, or no longer this worker's), its verdict: the engine's
        requests are then aborted, as the answer is cancelled."""
        answer = asyncio.ensure_future(self.engine.pool(job_id, job))
        try:
            while not (await asyncio.wait({answer}, timeout=POOLING_CHECK_SECONDS))[0]:
                verdict = await self.publisher.step(job_id, [])
                if verdict is not Verdict.go:
                    return verdict
            return answer.result()
        finally:
            answer.cancel()
            await asyncio.gather(answer, return_exceptions=True)

    def _reply(self, request: JobRequest, prompts: list[Prompt]) -> Reply | None:
        """The parsing of a chat's output, where the pool parses; a request its parsers refuse (a
        constraint its tools make that vLLM cannot take) fails the job."""
        if self.replies is None:
            return None
        try:
            return self.replies.reply(request, prompts[0].token_ids)
        except (ValueError, TypeError) as exc:
            raise EngineError(f"the chat's tools cannot be parsed: {exc}") from exc

    def _check_fits(self, prompt: Prompt) -> None:
        budget = self.engine.max_model_len - prompt.request.max_tokens
        if len(prompt.token_ids) > budget:
            raise PromptTooLong(
                f"prompt has {len(prompt.token_ids)} tokens; the context of {self.engine.max_model_len} "
                f"minus max_tokens {prompt.request.max_tokens} leaves room for {max(budget, 0)}"
            )

    async def _stop(self, job_id: str, chunker: Chunker, verdict: Verdict, prompts: int) -> Ending:
        """A step answered other than `go`: abort the engine requests (one per prompt), then end
        cancelled or leave."""
        if verdict is Verdict.behind:
            raise StreamBehind
        await abort(self.engine, job_id, prompts)
        if verdict is Verdict.cancel:
            self.metrics.cancelled(self.publisher.cancels_asked_at.pop(job_id, None))
        if verdict is Verdict.lost:
            log.warning(
                "lease lost after %d tokens; the job is not this worker's any more", chunker.completion_tokens
            )
            return Ending.left
        log.info("cancelled after %d tokens; engine request aborted", chunker.completion_tokens)
        return await self._end(job_id, chunker, chunker.cancelled(), JobState.cancelled)

    async def _complete(self, job_id: str, chunker: Chunker, events: list[Event]) -> Ending:
        reasons = chunker.finish_reasons
        if "abort" in reasons:  # aborted inside the engine, not by a cancel of ours
            message = "the engine aborted the request"
            failed = events + chunker.error(message, EngineError.error_type)
            return await self._end(job_id, chunker, failed, JobState.failed, error=message)
        events += chunker.done()
        return await self._end(job_id, chunker, events, JobState.completed, finish_reason=reasons[0])

    async def _fail(self, job_id: str, chunker: Chunker, message: str, code: str) -> Ending:
        log.warning("failed (%s): %s", code, message)
        return await self._end(job_id, chunker, chunker.error(message, code), JobState.failed, error=message)

    async def _end(
        self,
        job_id: str,
        chunker: Chunker,
        events: list[Event],
        state: JobState,
        finish_reason: str | None = None,
        error: str | None = None,
        result: dict[str, Any] | None = None,
    ) -> Ending:
        """Publish the last events (the terminal one last) and write the outcome to the record."""
        output = chunker.output
        outcome = Outcome(
            state=state,
            text=output.text,
            token_count=output.token_count,
            usage=chunker.usage,
            finish_reason=finish_reason,
            error=error,
            reasoning=output.reasoning,
            tool_calls=output.tool_calls,
            result=result,
        )
        finished = await self.publisher.finish(job_id, events, outcome)
        if finished.outcome is FinishOutcome.behind:
            raise StreamBehind
        if finished.outcome is FinishOutcome.lost:
            log.warning("lease lost before the job could end; the job is not this worker's any more")
            return Ending.left
        if finished.state is JobState.queued:
            # Started on a master that a failover replaced, and the new one never had the start: the
            # job waits in its queue there, for a run that writes to a master that keeps it.
            log.warning("the job is queued again (a failover lost its start): left for another run")
            return Ending.left
        clock = self.jobs.get(job_id)  # gone only if the run was cancelled twice while it ended
        if finished.outcome is FinishOutcome.ended and clock is not None:
            clock.ended(state)
        ended_as = finished.state.value if finished.state is not None else "missing"
        log.info("%s: %d tokens, finish_reason %s", ended_as, chunker.completion_tokens, finish_reason)
        return Ending.ended

    async def _hand_back(self, job_id: str, started: Started, reason: str) -> Ending:
        """Stop generating and release the job's lease now, so that another worker resumes it without
        waiting for the lease to lapse. While Redis is unreachable, try until it would have lapsed."""
        await abort(self.engine, job_id, started.request.prompt_count)
        attempt = started.attempt
        give_up_at = time.monotonic() + self.leases.lease_seconds
        while True:
            try:
                answer = await self.leases.release(
                    job_id, self.engine.model_name, reason, self.worker_id, attempt
                )
            except BackendUnavailable as exc:
                if time.monotonic() >= give_up_at:
                    log.warning(
                        "not handed back (%s); a reaper releases it once its lease lapses", exc.message
                    )
                    return Ending.left
                await asyncio.sleep(HAND_BACK_RETRY_SECONDS)
            else:
                log.info("handed back (%s): %s", reason, answer.value)
                return Ending.left
