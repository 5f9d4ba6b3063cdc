"""The arq job: start a queued job, drive the engine, publish each step, end with one terminal event."""

from __future__ import annotations

import asyncio
import logging
from contextlib import aclosing
from typing import Any

from shared.errors import EngineError, PromptTooLong, StreampoolError
from shared.events import Event, JobState
from shared.jobstore import JobStore, Outcome
from shared.logs import job_context
from shared.requests import JobRequest
from worker.chunker import Chunker
from worker.engine import Engine, Prompt
from worker.publisher import Publisher

log = logging.getLogger(__name__)

FIRST_WORKER_SEQ = 2  # seq 0 is `queued` (gateway), 1 is `running` (start)


class JobRunner:
    """Runs one job at a time per call; a worker runs hundreds of calls at once so vLLM batches them."""

    def __init__(self, engine: Engine, store: JobStore, publisher: Publisher, worker_id: str) -> None:
        self.engine = engine
        self.store = store
        self.publisher = publisher
        self.worker_id = worker_id
        self.running = 0

    async def run(self, job_id: str) -> None:
        with job_context(job_id):
            request = await self.store.start(job_id, self.worker_id, self.engine.model_name)
            if request is None:
                log.info("not queued any more (cancelled before it started); skipped")
                return
            self.running += 1
            try:
                await self._run_started(job_id, request)
            finally:
                self.running -= 1

    async def _run_started(self, job_id: str, request: JobRequest) -> None:
        chunker = Chunker(request.stream_step, 0, FIRST_WORKER_SEQ)
        try:
            # Tokenizing a long prompt takes a while: off the event loop that serves every other job.
            prompt = await asyncio.to_thread(self.engine.render, request)
            chunker.prompt_tokens = len(prompt.token_ids)
            log.info("running: %d prompt tokens, max_tokens %d", len(prompt.token_ids), request.max_tokens)
            self._check_fits(prompt)
            await self._generate(job_id, prompt, chunker)
        except StreampoolError as exc:
            await self._fail(job_id, chunker, exc.message, exc.error_type)
        except asyncio.CancelledError:
            # arq cancels the job on timeout or shutdown: the stream still gets its terminal event.
            await asyncio.shield(self._fail(job_id, chunker, "the worker stopped the job", "worker_stopped"))
            raise
        except Exception as exc:
            log.exception("job crashed")
            await self._fail(job_id, chunker, f"internal error: {exc!r}", "internal")

    def _check_fits(self, prompt: Prompt) -> None:
        budget = self.engine.max_model_len - prompt.request.max_tokens
        if len(prompt.token_ids) > budget:
            raise PromptTooLong(
                f"prompt has {len(prompt.token_ids)} tokens; the context of {self.engine.max_model_len} "
                f"minus max_tokens {prompt.request.max_tokens} leaves room for {max(budget, 0)}"
            )

    async def _generate(self, job_id: str, prompt: Prompt, chunker: Chunker) -> None:
        async with aclosing(self.engine.generate(job_id, prompt)) as deltas:
            async for delta in deltas:
                events = chunker.feed(delta)
                if delta.finished:
                    await self._complete(job_id, chunker, events, delta.finish_reason or "stop")
                    return
                if await self.publisher.step(job_id, events):
                    await self.engine.abort(job_id)
                    log.info("cancelled after %d tokens; engine request aborted", chunker.completion_tokens)
                    await self._end(job_id, chunker, chunker.cancelled(), JobState.cancelled)
                    return

    async def _complete(self, job_id: str, chunker: Chunker, events: list[Event], reason: str) -> None:
        if reason == "abort":  # aborted inside the engine, not by a cancel of ours
            message = "the engine aborted the request"
            failed = events + chunker.error(message, EngineError.error_type)
            await self._end(job_id, chunker, failed, JobState.failed, error=message)
            return
        events += chunker.done(reason)
        state = await self._end(job_id, chunker, events, JobState.completed, finish_reason=reason)
        log.info("%s: %d tokens, finish_reason %s", state, chunker.completion_tokens, reason)

    async def _fail(self, job_id: str, chunker: Chunker, message: str, code: str) -> None:
        log.warning("failed (%s): %s", code, message)
        await self._end(job_id, chunker, chunker.error(message, code), JobState.failed, error=message)

    async def _end(
        self,
        job_id: str,
        chunker: Chunker,
        events: list[Event],
        state: JobState,
        finish_reason: str | None = None,
        error: str | None = None,
    ) -> str:
        """Publish the last events (the terminal one last) and write the outcome to the record."""
        outcome = Outcome(
            state=state,
            text=chunker.text,
            token_count=chunker.completion_tokens,
            usage=chunker.usage,
            finish_reason=finish_reason,
            error=error,
        )
        return await self.publisher.finish(job_id, events, outcome)


async def run_job(ctx: dict[str, Any], job_id: str) -> None:
    """arq's entry point for a job."""
    runner: JobRunner = ctx["runner"]
    await runner.run(job_id)
