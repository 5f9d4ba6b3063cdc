"""Cancellation: a cancel asked of a running job (its lease carries it) stops the engine within a few
steps and ends the stream."""

from __future__ import annotations

import httpx
import redis.asyncio as aioredis

from shared.workers import WorkerInfo
from tests.conftest import System
from tests.helpers import LONG_PROMPT, eventually, read_sse, streamed_token_ids, submit

STEPS_BEFORE_ABORT = 8  # a few engine steps: every step reads the lease, and the cancel it carries


async def _worker_idle(redis_client: aioredis.Redis, system: System, worker_id: str) -> bool:
    """Whether the worker's heartbeat says it runs no job and its engine holds no request."""
    beat = await redis_client.get(system.keys.worker(worker_id))
    assert beat is not None, f"worker {worker_id} has no heartbeat"
    info = WorkerInfo.model_validate_json(beat)
    return info.running_jobs == 0 and info.engine_requests == 0


async def test_cancel_mid_generation_ends_with_cancelled_and_the_engine_stops(
    client: httpx.AsyncClient, system: System, redis_client: aioredis.Redis
) -> None:
    job_id = await submit(client, prompt=LONG_PROMPT, max_tokens=1000, temperature=0)
    seen = await read_sse(client, job_id, stop_after=7)  # queued, running, 5 deltas
    assert seen[-1][1]["type"] == "delta"
    tokens_seen = len(streamed_token_ids([event for _, event in seen]))
    answer = await client.post(f"/v1/jobs/{job_id}/cancel")
    assert answer.status_code == 202 and answer.json()["status"] == "running"

    rest = await read_sse(client, job_id, last_event_id=seen[-1][0])
    cancelled = rest[-1][1]
    assert cancelled["type"] == "cancelled"
    events = [event for _, event in seen + rest]
    assert cancelled["usage"]["completion_tokens"] == len(streamed_token_ids(events))
    assert cancelled["usage"]["completion_tokens"] - tokens_seen <= STEPS_BEFORE_ABORT

    record = (await client.get(f"/v1/jobs/{job_id}")).json()
    assert record["status"] == "cancelled"
    assert record["output"]["token_count"] == cancelled["usage"]["completion_tokens"]
    # The worker's next heartbeat reports what its engine still holds; tests run one at a time, so
    # no job running there means this one's job function is over and can append nothing more.
    await eventually(lambda: _worker_idle(redis_client, system, record["worker"]), "the worker is idle")
    [(last_id, _)] = await redis_client.xrevrange(system.keys.stream(job_id), count=1)
    assert last_id == rest[-1][0]  # nothing after `cancelled`
