"""The same engine the worker runs (worker.vllm_engine.VllmEngine), called in-process: the baseline
that the full path's throughput and latency are compared against."""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import Callable

import psutil

from bench import first_token
from bench.engine_figures import MAX_TOKENS, EngineRun
from bench.stats import StreamTiming, summarize
from bench.workload import closed_loop
from shared.config import Settings
from shared.requests import JobRequest


async def run(
    settings: Settings,
    levels: list[tuple[int, int]],
    max_tokens: int,
    first_tokens: int,
    on_done: Callable[[], None],
) -> EngineRun:
    """Each (concurrency, rounds) level in turn after one warm-up stream, then `first_tokens` jobs one at a
    time (bench.first_token); the engine is shut down at the end so that it never runs beside the worker's."""
    from worker.engine import render
    from worker.vllm_engine import VllmEngine  # heavy: imported only when this phase runs

    before = set(_live_children())
    engine = VllmEngine(settings)
    ids = itertools.count()

    async def one(request: JobRequest) -> StreamTiming:
        timing = StreamTiming(started=time.monotonic())
        (prompt,) = await render(engine, request)  # as the worker does
        async for delta in engine.generate(f"bench-{next(ids)}", prompt):
            timing.add(time.monotonic(), len(delta.token_ids))
            timing.tokens += len(delta.token_ids)
        return timing

    try:
        await closed_loop(1, 1, max_tokens, one, lambda: None)  # warm-up, not measured
        summaries = []
        for concurrency, rounds in levels:
            timings, seconds, cpu = await closed_loop(concurrency, rounds, max_tokens, one, on_done)
            summaries.append(summarize(concurrency, timings, seconds, cpu))
        timings, _, _ = await closed_loop(1, first_tokens, MAX_TOKENS, one, on_done, first_token.request)
        return EngineRun(summaries, [timing.ttft for timing in timings])
    finally:
        engine.shutdown()
        await _engine_gone(before)


async def _engine_gone(before: set[int], timeout: float = 60) -> None:
    """Until the engine's processes (the spawned engine core) have exited: shutdown does not wait for them."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not [pid for pid in _live_children() if pid not in before]:
            return
        await asyncio.sleep(0.2)
    raise RuntimeError("the in-process engine's processes did not exit")


def _live_children() -> list[int]:
    """Running children, but not multiprocessing's resource tracker (it lives until this process exits)."""
    pids = []
    for child in psutil.Process().children(recursive=True):
        try:
            if child.status() != psutil.STATUS_ZOMBIE and "resource_tracker" not in " ".join(child.cmdline()):
                pids.append(child.pid)
        except psutil.NoSuchProcess:
            pass
    return pids
