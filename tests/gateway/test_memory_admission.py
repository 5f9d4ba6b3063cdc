"""Admission by memory: past `redis_memory_high_water` of Redis's `maxmemory`, every route refuses
new jobs (429 `overloaded`, with Retry-After), while a job already running streams to its end in
the room left below `maxmemory`.

On a private redis-server with a small `maxmemory` and `noeviction`, as compose and Kubernetes
run it, filled past the mark with another application's keys. No engine runs: a stand-in worker
takes the job and writes its steps and its end with the job store's own lifecycle scripts, as the
worker's publisher sends them.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest
import redis.asyncio as aioredis

from shared.config import Settings
from shared.events import DeltaEvent, DoneEvent, JobState, Usage
from shared.jobstore import JobStore, Outcome
from shared.keys import Keys
from shared.lifecycle import scripts
from shared.lifecycle.transitions import JobStep, Verdict
from tests.conftest import make_settings
from tests.gateway.stand_ins import heartbeat, private_redis
from tests.helpers import eventually, in_process_gateway, read_sse, scrape

MAXMEMORY = 32 * 2**20
FILL_TO = 0.93  # past the default mark (0.9), with room left for the running job's writes
FILLER = "x" * 256 * 2**10
MODEL = "served-model"
WORKER = "stand-in-worker"
NATIVE = {"prompt": "hi", "max_tokens": 8}
WORDS = ["Once", " upon", " a", " time", "."]
BURST = 20


@pytest.fixture
async def small_redis(tmp_path: Path) -> AsyncIterator[tuple[Settings, aioredis.Redis]]:
    options = ("--maxmemory", str(MAXMEMORY), "--maxmemory-policy", "noeviction")
    with private_redis(tmp_path, *options) as url:
        client = aioredis.Redis.from_url(url, decode_responses=True)
        yield make_settings(url, allow_unauthenticated=True), client
        await client.aclose()


async def _share_used(client: aioredis.Redis) -> float:
    memory = await client.info("memory")
    return int(memory["used_memory"]) / int(memory["maxmemory"])


async def _fill(client: aioredis.Redis) -> None:
    """Another application's keys, until Redis holds FILL_TO of its maxmemory."""
    n = 0
    while await _share_used(client) < FILL_TO:
        await client.set(f"another-app:{n}", FILLER)
        n += 1


async def _run_to_the_end(client: aioredis.Redis, store: JobStore, job_id: str) -> None:
    """What a worker writes for the job, step by step, then its end."""
    await client.script_load(scripts.STEP.source)
    for seq, word in enumerate(WORDS, start=2):
        delta = DeltaEvent(seq=seq, text=word, token_ids=[seq])
        answer = await store.step(WORKER, JobStep(job_id, [delta]))
        assert answer.verdict is Verdict.go
    usage = Usage(prompt_tokens=1, completion_tokens=len(WORDS))
    done = DoneEvent(seq=2 + len(WORDS), finish_reason="stop", usage=usage)
    outcome = Outcome(JobState.completed, "".join(WORDS), len(WORDS), usage, finish_reason="stop")
    await client.execute_command(*store.finish_commands(job_id, WORKER, [done], outcome).record)


async def test_past_the_memory_mark_every_route_refuses_and_a_running_job_streams_to_its_end(
    small_redis: tuple[Settings, aioredis.Redis],
) -> None:
    settings, client = small_redis
    keys = Keys.of(settings)
    store = JobStore(client, keys, settings)
    await heartbeat(client, keys, WORKER, MODEL)
    async with in_process_gateway(settings) as http:
        running = await http.post("/v1/jobs", json=NATIVE)
        assert running.status_code == 202, running.text
        job_id = running.json()["id"]
        assert await store.start(job_id, WORKER, MODEL, lease_seconds=60) is not None
        reader = asyncio.create_task(read_sse(http, job_id))

        await _fill(client)

        async def submit() -> httpx.Response:
            return await http.post("/v1/jobs", json=NATIVE)

        # The gateway reads Redis's memory at most once a second: within that, the mark shows.
        native = await eventually(
            submit, "a refusal by memory", 5, until=lambda answer: answer.status_code != 202
        )
        openai = await http.post("/v1/completions", json={"model": MODEL, "prompt": "Once"})
        tgi = await http.post("/generate", json={"inputs": "hi"})

        await _run_to_the_end(client, store, job_id)
        events = [event for _, event in await reader]
        scraped = await scrape(http)
    assert native.status_code == openai.status_code == tgi.status_code == 429, native.text
    assert native.json()["error_type"] == tgi.json()["error_type"] == "overloaded"
    assert "maxmemory" in native.json()["error"]
    assert openai.json()["error"]["type"] == "rate_limit_error"
    assert all(int(answer.headers["Retry-After"]) >= 1 for answer in (native, openai, tgi))
    assert scraped.value("streampool_jobs_rejected_total", reason="redis_memory") == 3
    assert [event["type"] for event in events] == ["status", "status", *["delta"] * len(WORDS), "done"]
    assert "".join(event["text"] for event in events if event["type"] == "delta") == "".join(WORDS)
    assert await _share_used(client) < 1


async def test_redis_memory_is_read_at_most_once_a_second_whatever_the_submissions(
    small_redis: tuple[Settings, aioredis.Redis],
) -> None:
    settings, client = small_redis
    async with in_process_gateway(settings) as http:
        assert (await http.post("/v1/jobs", json=NATIVE)).status_code == 202  # connected, and read once
        await client.config_resetstat()
        answers = [await http.post("/v1/jobs", json=NATIVE) for _ in range(BURST)]
        stats = await client.info("commandstats")
    assert {answer.status_code for answer in answers} == {202}
    # The burst takes well under a second; it may straddle one second's turn.
    assert int(stats.get("cmdstat_info", {"calls": 0})["calls"]) <= 1
