"""A worker that dies (SIGKILL) or freezes (SIGSTOP) mid-generation: another worker resumes the job
from the tokens in its stream, and readers see one seamless stream (a client of a background response
too, which resumes its dropped stream with `starting_after`); after `max_attempts` runs the job fails
with `worker_lost`."""

from __future__ import annotations

import asyncio
import signal
from typing import Any

import httpx
import openai
import pytest

from tests.faults.conftest import (
    RECOVERY,
    WAIT_TIMEOUT,
    Pool,
    assert_one_seamless_stream,
    wait_for_tokens,
)
from tests.helpers import (
    LONG_PROMPT,
    poll_all,
    read_sse,
    record,
    streamed_text,
    streamed_token_ids,
    submit,
    wait_until,
)

MAX_TOKENS = 200


@pytest.fixture(scope="module")
def pool(synthetic_pool: Pool) -> Pool:
    """On the synthetic engine: the subject is the lease and the queue (a worker gone, its job taken over),
    not generation; a job resumed on the real engine is tests/faults/test_engine_death.py's."""
    return synthetic_pool


async def test_a_killed_workers_job_is_resumed_by_another_and_each_of_its_clients_sees_one_stream(
    pool: Pool, client: httpx.AsyncClient
) -> None:
    """The job is a background response. A reader of its events stays connected through the kill; the
    response's client, its stream dropped with the kill, resumes it with `starting_after` and sees one
    sequence too, with a second `response.in_progress` where the other worker took over."""
    pool.ensure_workers()
    async with openai.AsyncOpenAI(
        base_url=f"{pool.base_url}/v1", api_key="none", max_retries=0, timeout=WAIT_TIMEOUT
    ) as sdk:
        stream = await sdk.responses.create(
            model=pool.settings.model_name,
            input=LONG_PROMPT,
            background=True,
            stream=True,
            max_output_tokens=MAX_TOKENS,
            temperature=0,
        )
        first: list[Any] = []
        async for event in stream:
            first.append(event)
            if event.type == "response.output_text.delta":
                break
        await stream.close()
        job_id = first[0].response.id.removeprefix("resp_")
        reader = asyncio.create_task(read_sse(client, job_id))
        running = await wait_for_tokens(client, job_id, 10)
        victim = pool.worker_named(running["worker"])
        pool.processes.kill(victim)  # with its engine core, as a crashed machine

        resumed = await sdk.responses.retrieve(
            first[0].response.id, stream=True, starting_after=first[-1].sequence_number
        )
        rest = [event async for event in resumed]

    pairs = await asyncio.wait_for(reader, WAIT_TIMEOUT)
    stream_ids = [stream_id for stream_id, _ in pairs]
    assert stream_ids == sorted(set(stream_ids), key=lambda sid: tuple(map(int, sid.split("-"))))
    events = [event for _, event in pairs]
    assert_one_seamless_stream(events)
    statuses = [
        (event["state"], event["resumed"], event["attempt"]) for event in events if event["type"] == "status"
    ]
    assert statuses == [("queued", False, None), ("running", False, 1), ("running", True, 2)]
    resumed_at = next(n for n, event in enumerate(events) if event["type"] == "status" and event["resumed"])
    assert len(streamed_token_ids(events[:resumed_at])) >= 10  # the kill came mid-generation

    done = events[-1]
    tokens = streamed_token_ids(events)
    assert done["type"] == "done" and done["usage"]["completion_tokens"] == len(tokens)
    if done["finish_reason"] == "length":
        assert len(tokens) == MAX_TOKENS
    # The response's input is one user message: the same prompt, alone.
    one_token = await submit(
        client, messages=[{"role": "user", "content": LONG_PROMPT}], max_tokens=1, temperature=0
    )
    alone = await poll_all(client, one_token)
    assert done["usage"]["prompt_tokens"] == alone[-1]["usage"]["prompt_tokens"]

    job = await record(client, job_id)
    assert (job["status"], job["attempts"]) == ("completed", 2)
    assert job["output"] == {"text": streamed_text(events), "token_count": len(tokens)}
    assert pool.worker_named(job["worker"]) != victim

    # The response's client: one sequence across the kill, its text the job's.
    responses = first + rest
    assert [event.sequence_number for event in responses] == list(range(len(responses)))
    assert [event.type for event in responses].count("response.in_progress") == 2
    final = rest[-1]
    assert final.type in ("response.completed", "response.incomplete")
    text = "".join(event.delta for event in responses if event.type == "response.output_text.delta")
    assert text == final.response.output_text == job["output"]["text"]


async def test_a_job_whose_workers_keep_vanishing_fails_with_worker_lost_and_they_write_no_more(
    pool: Pool, client: httpx.AsyncClient
) -> None:
    """Both runs' workers freeze (SIGSTOP) instead of dying, so that each comes back afterwards,
    having lost its lease, and must not write to the job again."""
    assert RECOVERY["max_attempts"] == 2
    pool.ensure_workers()
    job_id = await submit(client, prompt=LONG_PROMPT, max_tokens=MAX_TOKENS, temperature=0)
    first = pool.worker_named((await wait_for_tokens(client, job_id, 5))["worker"])
    pool.processes.signal(first, signal.SIGSTOP)
    try:
        resumed = await wait_until(client, job_id, lambda job: job["attempts"] == 2, "a resume")
        second = pool.worker_named(resumed["worker"])
        await wait_for_tokens(client, job_id, resumed["output"]["token_count"] + 3)
        pool.processes.signal(second, signal.SIGSTOP)
        pool.processes.signal(first, signal.SIGCONT)  # its reaper finds the second lease lapsed
        failed = await wait_until(client, job_id, lambda job: job["status"] != "running", "the job fails")
    finally:
        for name in (first, second):
            pool.processes.signal(name, signal.SIGCONT)

    assert failed["status"] == "failed" and "max_attempts" in failed["error"]
    # Both workers live on, and the second lets go of the job when it wakes, writing nothing more.
    await asyncio.to_thread(pool.ensure_workers)
    # Its heartbeat may still say 0 jobs from before it took the job: its log says when it let go.
    # worker.jobs, once the job's task gives the job up: at its next step, or at its end when its
    # engine core (not stopped) finished the generation meanwhile.
    let_go = "the job is not this worker's any more"

    def gave_up(_: dict[str, Any]) -> bool:
        return let_go in pool.log(second) and pool.running_jobs(second) == 0

    await wait_until(client, job_id, gave_up, "the job is let go")
    events = await poll_all(client, job_id)
    assert_one_seamless_stream(events)
    assert (events[-1]["type"], events[-1]["code"]) == ("error", "worker_lost")
    resumed_events = [event for event in events if event["type"] == "status" and event["resumed"]]
    assert [event["attempt"] for event in resumed_events] == [2]
    assert failed["output"]["token_count"] == len(streamed_token_ids(events))
