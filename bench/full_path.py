"""The same workload through the whole system: HTTP submit, arq queue, worker, Redis stream, SSE relay."""

from __future__ import annotations

from collections.abc import Callable

import httpx

from bench.jobclient import run_job
from bench.stats import PhaseSummary, StreamTiming, summarize
from bench.workload import closed_loop
from shared.requests import JobRequest


async def run_levels(
    http: httpx.AsyncClient,
    levels: list[tuple[int, int]],
    max_tokens: int,
    on_done: Callable[[], None],
) -> list[PhaseSummary]:
    """Each (concurrency, rounds) level in turn, after one warm-up job, as engine_baseline runs them."""

    async def one(request: JobRequest) -> StreamTiming:
        return (await run_job(http, request)).timing

    await closed_loop(1, 1, max_tokens, one, lambda: None)
    summaries = []
    for concurrency, rounds in levels:
        timings, seconds, cpu = await closed_loop(concurrency, rounds, max_tokens, one, on_done)
        summaries.append(summarize(concurrency, timings, seconds, cpu))
    return summaries
