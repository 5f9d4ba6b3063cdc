"""Time to first token at 1 stream, with enough samples to settle a few milliseconds, and where the full
path's share of it goes.

Both sides run the same jobs one at a time (short prompts; max_tokens 2: the first token is streamed by
an engine step, as in any longer job). Along the full path each job's first token is split at points
stamped by one machine's clock: the client before its POST, the gateway's `created_at` (before its
submit script), the worker's `started_at` (before its start script), the Redis stream id of the first
`delta` (the moment Redis appended it, millisecond resolution) and the client's receipt of that delta.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Callable

from bench.engine_figures import MAX_TOKENS, SHORT_PROMPTS, FirstToken
from bench.sse_client import Submitter
from bench.workload import SEED
from shared.events import TERMINAL_EVENT_TYPES
from shared.jobstore import JobStore
from shared.requests import JobRequest


def request(index: int, max_tokens: int) -> JobRequest:
    """The `index`-th job of this phase: a short greedy prompt, so that prefill (and the drift of the
    machine's speed, a few per cent of it) is small next to the milliseconds the path adds."""
    prompt = SHORT_PROMPTS[index % len(SHORT_PROMPTS)]
    return JobRequest(prompt=prompt, max_tokens=max_tokens, temperature=0.0, seed=SEED)


async def full_path(
    port: int, store: JobStore, samples: int, on_done: Callable[[], None]
) -> list[FirstToken]:
    """`samples` jobs, one after another, each submitted with `Accept: text/event-stream` and followed in
    the same request (as an OpenAI client's `stream=True` is).

    The client is the bench's leanest (raw sockets: bench.sse_client), so that what it adds to the time
    to first token is as small as a client's can be; the throughput levels use httpx.
    """
    submitter = Submitter(port)
    measured = []
    try:
        for number in range(samples):
            body = request(number, MAX_TOKENS).model_dump_json(exclude_none=True).encode()
            wall, began = time.time(), time.monotonic()
            job_id, events = await submitter.submit_and_follow(body)
            received = await _first_delta(job_id, events) - began + wall
            measured.append(await _split(store, job_id, wall, received))
            on_done()
    finally:
        submitter.close()
    return measured


async def _first_delta(job_id: str, events: AsyncIterator[tuple[str, str]]) -> float:
    """Read the job's events to its terminal one; when (monotonic) its first delta arrived."""
    first = None
    async for kind, _ in events:
        if kind == "delta" and first is None:
            first = time.monotonic()
        elif kind in TERMINAL_EVENT_TYPES:
            break
    if first is None:
        raise RuntimeError(f"job {job_id} ended without a delta")
    async for _ in events:  # the end of the answer, so that the connection serves the next submission
        pass
    return first


async def _split(store: JobStore, job_id: str, wall: float, received: float) -> FirstToken:
    """The job's first token split at the record's times and when Redis wrote its first delta (`at`)."""
    record = await store.record(job_id)
    if record.started_at is None:
        raise RuntimeError(f"job {job_id} streamed a token but has no started_at")
    entries = await store.streams.xrange(store.keys.stream(job_id))
    appended = next(int(fields["at"]) / 1000 for _, fields in entries if fields["type"] == "delta")
    created, started = record.created_at.timestamp(), record.started_at.timestamp()
    return FirstToken(
        received - wall, created - wall, started - created, appended - started, received - appended
    )
