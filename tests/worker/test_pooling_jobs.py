"""A pooling job's run on a worker, against the real Redis, on the synthetic engine's embeddings (the
subject is the job's run, not vLLM's answer): one `done` event holds the whole answer, which the job's
record shows; refusals end it with vLLM's error type as the code; a cancel stops it; a job handed back
runs again whole."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from shared.config import DEFAULT_MODEL_DIR, WorkerSettings
from shared.jobstore import JobStore
from shared.lifecycle.transitions import ReleaseOutcome
from shared.pooling import PoolingJob
from shared.requests import JobRequest
from tests.worker.test_jobs import LEASE_SECONDS, runner, stream
from worker.jobs import POOLING_CHECK_SECONDS, Ending
from worker.leases import Leases
from worker.synthetic_engine import SyntheticEngine, read_model_card

EMBEDDING_POOL = ["--runner", "pooling", "--convert", "embed"]
TEXTS = ["the first input", "the second", "the third and last"]
ADAPTER = "sql-lora"


def synthetic(engine_args: list[str], step_seconds: float = 0.001) -> SyntheticEngine:
    if not DEFAULT_MODEL_DIR.is_dir():
        pytest.skip("the default model is not prepared (make setup)")
    settings = WorkerSettings(
        engine="synthetic", synthetic_step_seconds=step_seconds, max_model_len=256, engine_args=engine_args
    )
    return SyntheticEngine(settings, read_model_card(settings.model, settings.model_name, 256))


@pytest.fixture(scope="module")
def engine() -> SyntheticEngine:
    return synthetic(EMBEDDING_POOL)


def embeddings(**body: Any) -> JobRequest:
    inputs = body["input"]
    return JobRequest(pooling=PoolingJob(route="embeddings", body=body, inputs=len(inputs)))


async def submit(store: JobStore, engine: SyntheticEngine, request: JobRequest) -> str:
    return (await store.submit(request, model=engine.model_name, max_queued=0)).job_id


async def test_a_pooling_job_ends_with_one_done_event_holding_its_whole_answer_which_its_record_shows(
    store: JobStore, engine: SyntheticEngine
) -> None:
    job_id = await submit(store, engine, embeddings(input=TEXTS))
    assert await runner(store, engine).run(job_id) is Ending.ended
    events = await stream(store, job_id)
    assert [event["type"] for event in events] == ["status", "status", "done"]
    result = events[-1]["result"]
    assert result["id"] == f"embd-{job_id}"
    assert [item["index"] for item in result["data"]] == [0, 1, 2]
    assert events[-1]["usage"] == {"prompt_tokens": result["usage"]["prompt_tokens"], "completion_tokens": 0}
    record = await store.record(job_id)
    assert record.status == "completed"
    assert record.output.result == result
    assert record.usage is not None and record.usage.prompt_tokens == result["usage"]["prompt_tokens"] > 0


async def test_a_request_vllm_refuses_fails_with_its_words_and_its_error_type_as_the_code(
    store: JobStore, engine: SyntheticEngine
) -> None:
    job_id = await submit(store, engine, embeddings(input=TEXTS, dimensions=8))
    await runner(store, engine).run(job_id)
    events = await stream(store, job_id)
    assert [event["type"] for event in events] == ["status", "status", "error"]
    assert events[-1]["code"] == "BadRequestError"
    assert "does not support Matryoshka embeddings" in str(events[-1]["message"])
    record = await store.record(job_id)
    assert record.status == "failed" and record.output.result is None


async def test_generation_on_an_embedding_pool_and_embeddings_on_a_generating_one_fail_naming_what_it_serves(
    store: JobStore, engine: SyntheticEngine
) -> None:
    generation = await submit(store, engine, JobRequest(prompt="hi", max_tokens=4))
    await runner(store, engine).run(generation)
    refused = (await stream(store, generation))[-1]
    assert refused["type"] == "error"
    assert refused["message"] == f"{engine.model_name} does not generate: it serves /embeddings"

    generating = synthetic([])
    pooling = await submit(store, generating, embeddings(input=TEXTS))
    await runner(store, generating).run(pooling)
    refused = (await stream(store, pooling))[-1]
    assert (refused["type"], refused["code"]) == ("error", "BadRequestError")
    assert refused["message"] == f"{engine.model_name} does not serve /embeddings: it serves generation"


async def test_a_pooling_job_handed_back_runs_again_whole_on_the_next_worker(
    store: JobStore, engine: SyntheticEngine
) -> None:
    """Its first worker went before answering (nothing of an answer is written before all of it): the
    next run answers every input, after a `running` event that says it resumed."""
    job_id = await submit(store, engine, embeddings(input=TEXTS))
    assert await store.start(job_id, "worker-0", engine.model_name, lease_seconds=LEASE_SECONDS) is not None
    released = await Leases(store, store.settings).release(
        job_id, engine.model_name, "its worker shut down", "worker-0"
    )
    assert released is ReleaseOutcome.requeued

    assert await runner(store, engine).run(job_id) is Ending.ended
    events = await stream(store, job_id)
    assert events[-2]["type"] == "status" and events[-2]["resumed"] and events[-2]["attempt"] == 2
    assert [event["seq"] for event in events] == list(range(len(events)))
    once = await submit(store, engine, embeddings(input=TEXTS))
    await runner(store, engine).run(once)
    assert events[-1]["result"]["data"] == (await stream(store, once))[-1]["result"]["data"]
    assert (await store.record(job_id)).attempts == 2


async def test_a_pooling_job_cancelled_while_its_answer_is_made_ends_cancelled_without_one(
    store: JobStore,
) -> None:
    """A pooling job has no steps: it checks its cancel key meanwhile, and stops its engine requests."""
    slow = synthetic(EMBEDDING_POOL, step_seconds=10.0)
    job_id = await submit(store, slow, embeddings(input=TEXTS))
    run = asyncio.create_task(runner(store, slow).run(job_id))
    while (await store.record(job_id)).status != "running":
        await asyncio.sleep(0.01)
    await store.cancel(job_id)
    assert await asyncio.wait_for(run, POOLING_CHECK_SECONDS * 10) is Ending.ended
    events = await stream(store, job_id)
    assert [event["type"] for event in events] == ["status", "status", "cancelled"]
    record = await store.record(job_id)
    assert record.status == "cancelled" and record.output.result is None


async def test_a_pooling_job_naming_an_adapter_fails_rather_than_answer_with_the_base_model(
    store: JobStore, engine: SyntheticEngine
) -> None:
    request = embeddings(input=TEXTS).model_copy(update={"model": f"{engine.model_name}:{ADAPTER}"})
    job_id = await submit(store, engine, request)
    await runner(store, engine).run(job_id)
    refused = (await stream(store, job_id))[-1]
    assert (refused["type"], refused["code"]) == ("error", "BadRequestError")
    assert (
        refused["message"]
        == f"{engine.model_name} answers /embeddings with its base model alone, not with adapter {ADAPTER}"
    )
