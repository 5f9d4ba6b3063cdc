"""A worker killed (SIGKILL) mid-batch of embeddings: another worker answers the request again whole, and
its client, waiting in `embeddings.create` of the `openai` package, gets every input's vector, in
order, equal to those of a request that no kill interrupted."""

from __future__ import annotations

import asyncio
import base64
import time
from array import array
from collections.abc import Iterator

import httpx
import openai
import pytest

from tests.faults.conftest import WAIT_TIMEOUT, Pool, run_pool

EMBEDDING_POOL = ["--runner", "pooling", "--convert", "embed"]
STEP_SECONDS = 2.0  # a batch of embeddings takes one step of the synthetic engine: the kill lands inside it
INPUTS = [f"input number {number} of the corpus" for number in range(40)]


@pytest.fixture(scope="module")
def embedding_pool(redis_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pool]:
    """Synthetic embedding workers (vLLM's flags of an embedding pool): the subject is the lease and the
    queue, not vLLM's vectors, which tests/e2e/test_pooling.py compares with vLLM's server's. (Not named
    `pool`, which would count its tests among those on the real engine.)"""
    yield from run_pool(
        redis_url,
        tmp_path_factory,
        engine="synthetic",
        engine_args=EMBEDDING_POOL,
        synthetic_step_seconds=STEP_SECONDS,
    )


async def running_worker(pool: Pool) -> str:
    """The name of the worker that runs a job now, by the workers' heartbeats."""
    deadline = time.monotonic() + WAIT_TIMEOUT
    while time.monotonic() < deadline:
        running = [name for name in pool.live_workers() if pool.running_jobs(name)]
        if running:
            return running[0]
        await asyncio.sleep(0.1)
    raise AssertionError("no worker ran the embeddings job")


async def test_a_worker_killed_mid_batch_of_embeddings_loses_no_input(embedding_pool: Pool) -> None:
    pool = embedding_pool
    pool.ensure_workers()
    async with openai.AsyncOpenAI(
        base_url=f"{pool.base_url}/v1", api_key="none", max_retries=0, timeout=WAIT_TIMEOUT
    ) as sdk:
        waiting = asyncio.create_task(
            sdk.embeddings.with_raw_response.create(model=pool.settings.model_name, input=INPUTS)
        )
        victim = await running_worker(pool)
        pool.processes.kill(victim)
        answered = await asyncio.wait_for(waiting, WAIT_TIMEOUT)
        uninterrupted = await sdk.embeddings.create(model=pool.settings.model_name, input=INPUTS)

    answer = answered.parse()
    assert [item.index for item in answer.data] == list(range(len(INPUTS)))
    assert [item.embedding for item in answer.data] == [item.embedding for item in uninterrupted.data]
    async with httpx.AsyncClient(base_url=pool.base_url) as client:
        job = (await client.get(f"/v1/jobs/{answered.headers['x-streampool-job-id']}")).json()
    assert job["status"] == "completed" and job["attempts"] == 2
    assert pool.worker_named(job["worker"]) != victim
    kept = job["output"]["result"]["data"]  # as the client asked: base64, the `openai` package's default
    assert [list(array("f", base64.b64decode(item["embedding"]))) for item in kept] == [
        item.embedding for item in answer.data
    ]
