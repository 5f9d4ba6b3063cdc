"""Cancel latency: from the cancel request to the engine's abort, in milliseconds and in engine steps.

Steps after the cancel was accepted = the `cancelled` event's usage.completion_tokens minus the tokens
already streamed to the client when the cancel request returned (stream_step 1: one token per step)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import httpx

from bench.engine_figures import CancelSample
from bench.jobclient import follow, submit
from bench.stats import StreamTiming
from bench.workload import request
from shared.jobstore import JobStore

TOKENS_BEFORE_CANCEL = 8


async def one(http: httpx.AsyncClient, store: JobStore, number: int) -> CancelSample:
    job_id = await submit(http, request(number, max_tokens=512))
    enough = asyncio.Event()
    streamed = [0]

    def seen(tokens: int) -> None:
        streamed[0] = tokens
        if tokens >= TOKENS_BEFORE_CANCEL:
            enough.set()

    follower = asyncio.create_task(follow(http, job_id, StreamTiming(time.monotonic()), seen))
    await enough.wait()
    asked = time.monotonic()
    answer = await http.post(f"/v1/jobs/{job_id}/cancel")
    answer.raise_for_status()
    at_return = streamed[0]
    published = (await store.record(job_id)).output.token_count
    followed = await follower
    if followed.terminal["type"] != "cancelled":
        raise RuntimeError(f"job {job_id} ended with {followed.terminal['type']}, not cancelled")
    generated = int(followed.terminal["usage"]["completion_tokens"])
    return CancelSample(followed.terminal_at - asked, generated - at_return, generated - published)


async def measure(
    http: httpx.AsyncClient, store: JobStore, samples: int, on_done: Callable[[], None]
) -> list[CancelSample]:
    results = []
    for number in range(samples):
        results.append(await one(http, store, number))
        on_done()
    return results
