"""The full path as a client sees it: submit over HTTP, follow the job's SSE stream to its terminal event."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import httpx

from bench.sse_client import sse_events
from bench.stats import StreamTiming
from shared.events import TERMINAL_EVENT_TYPES
from shared.requests import JobRequest

SSE_HEADERS = {"Accept": "text/event-stream"}


@dataclass
class Followed:
    """A followed job: its timing, terminal event and when that arrived."""

    job_id: str
    timing: StreamTiming
    terminal: dict[str, Any]
    terminal_at: float
    streamed_tokens: int


async def submit(http: httpx.AsyncClient, request: JobRequest) -> str:
    answer = await http.post("/v1/jobs", content=request.model_dump_json(exclude_none=True))
    answer.raise_for_status()
    return str(answer.json()["id"])


async def follow(
    http: httpx.AsyncClient,
    job_id: str,
    timing: StreamTiming,
    on_tokens: Callable[[int], None] | None = None,
) -> Followed:
    """Read the stream to its terminal event; tokens come from token_ids and usage, never frame counts."""
    streamed = 0
    async with http.stream("GET", f"/v1/jobs/{job_id}/events", headers=SSE_HEADERS) as response:
        response.raise_for_status()
        async for kind, data in sse_events(response.aiter_lines()):
            now = time.monotonic()
            if kind == "delta":
                count = len(json.loads(data)["token_ids"])
                streamed += count
                timing.add(now, count)
                if on_tokens is not None:
                    on_tokens(streamed)
            elif kind in TERMINAL_EVENT_TYPES:
                event = json.loads(data)
                timing.tokens = int(event.get("usage", {}).get("completion_tokens", streamed))
                return Followed(job_id, timing, event, now, streamed)
    raise RuntimeError(f"job {job_id}: the stream ended without a terminal event")


async def run_job(http: httpx.AsyncClient, request: JobRequest) -> Followed:
    """Submit, then follow; the clock starts before the submission, as a user's would."""
    timing = StreamTiming(started=time.monotonic())
    job_id = await submit(http, request)
    return await follow(http, job_id, timing)


def client(base_url: str, connections: int = 256) -> httpx.AsyncClient:
    limits = httpx.Limits(max_connections=connections, max_keepalive_connections=connections)
    headers = {"Content-Type": "application/json"}
    return httpx.AsyncClient(base_url=base_url, timeout=300, limits=limits, headers=headers)
