"""Time to first token at 1 stream, with enough samples to settle a few milliseconds, and where the full
path's share of it goes.

Both sides run the same jobs one at a time (max_tokens 2: the first token is streamed by an engine step,
as in any longer job). Along the full path each job's first token is split at points stamped by one
machine's clock: the client before its POST, the gateway's `created_at` (before its submit script), the
worker's `started_at` (before its start script), the Redis stream id of the first `delta` (the moment
Redis appended it, millisecond resolution) and the client's receipt of that delta.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from bench.sse_client import EventsConnection, Submitter
from bench.workload import request
from shared.events import TERMINAL_EVENT_TYPES
from shared.jobstore import JobStore

MAX_TOKENS = 2


@dataclass(frozen=True)
class FirstToken:
    """One job's first token through the full path, in seconds, split where the clocks were read."""

    ttft: float  # client, before the POST, to the first delta's receipt
    to_record: float  # before the POST to the gateway's created_at: client, HTTP, validation, prompt count
    pickup: float  # created_at to started_at: the queue
    to_append: float  # started_at to the first delta's append: start, render, engine, publish
    relay: float  # the first delta's append to its receipt: gateway reader, fan-out, SSE, client


async def full_path(
    port: int, store: JobStore, samples: int, on_done: Callable[[], None]
) -> list[FirstToken]:
    """`samples` jobs submitted over HTTP and followed over SSE, one after another.

    The client is the bench's leanest (raw sockets: bench.sse_client), so that what it adds to the time
    to first token is as small as a client's can be; the throughput levels use httpx.
    """
    submitter = Submitter(port)
    measured = []
    try:
        for number in range(samples):
            body = request(number, MAX_TOKENS).model_dump_json(exclude_none=True).encode()
            wall, began = time.time(), time.monotonic()
            job_id = str((await submitter.submit(body))["id"])
            received = await _first_delta(port, job_id) - began + wall
            measured.append(await _split(store, job_id, wall, received))
            on_done()
    finally:
        submitter.close()
    return measured


async def _first_delta(port: int, job_id: str) -> float:
    """Follow the job to its terminal event; when (monotonic) its first delta arrived."""
    connection = await EventsConnection.open(port, job_id)
    first = None
    try:
        async for kind, _ in connection.events():
            if kind == "delta" and first is None:
                first = time.monotonic()
            elif kind in TERMINAL_EVENT_TYPES:
                break
    finally:
        connection.close()
    if first is None:
        raise RuntimeError(f"job {job_id} ended without a delta")
    return first


async def _split(store: JobStore, job_id: str, wall: float, received: float) -> FirstToken:
    """The job's first token split at the record's times and its first delta's stream id."""
    record = await store.record(job_id)
    if record.started_at is None:
        raise RuntimeError(f"job {job_id} streamed a token but has no started_at")
    entries = await store.redis.xrange(store.keys.stream(job_id))
    appended = next(int(entry_id.split("-")[0]) / 1000 for entry_id, f in entries if f["type"] == "delta")
    created, started = record.created_at.timestamp(), record.started_at.timestamp()
    return FirstToken(
        received - wall, created - wall, started - created, appended - started, received - appended
    )
