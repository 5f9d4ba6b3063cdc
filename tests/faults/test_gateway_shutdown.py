"""A gateway told to stop (SIGTERM) ends its open event streams at once, without a terminal event,
so that each client resumes from its last `id:` with `Last-Event-ID` on another gateway and misses
nothing; it accepts no new connection from then on, and answers the requests it already has.
OpenAI and TGI clients cannot resume: their answers go on for the grace period
(`shutdown_grace_seconds`), and only then are their jobs cancelled; but for kept OpenAI answers (a
stored chat completion), whose answers then end with the gateway's unavailability while their jobs go
on, to be resumed through another gateway.

The gateway stopped here is a process of the test's own on the settings of the session's synthetic
system (the same Redis and workers); that system's gateway, left running, is the one clients move to.
The subject is the gateway: its workers run the synthetic engine, whose answers end only at
`max_tokens`, a token every `synthetic_step_seconds` (0.03 s).
"""

from __future__ import annotations

import asyncio
import signal
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from subprocess import Popen
from typing import Any

import httpx
import openai
import pytest
from huggingface_hub import AsyncInferenceClient, TextGenerationStreamOutput
from openai.types import Completion
from openai.types.chat import ChatCompletionChunk
from prometheus_client.parser import text_string_to_metric_families

from cli.launcher import wait_healthy
from tests.conftest import SYSTEM_START_TIMEOUT, WORKERS, System
from tests.faults.conftest import WAIT_TIMEOUT, assert_one_seamless_stream
from tests.helpers import (
    LONG_PROMPT,
    TERMINAL,
    deltas,
    eventually,
    read_sse,
    record,
    resumed_chunks,
    submit,
)
from tests.processes import Processes, free_port

Received = list[tuple[str, dict[str, Any]]]

COUNTING = "Count to one thousand: 1, 2, 3, 4, 5, 6,"
# Seconds of answer (a token every 0.03 s), well within the grace period these tests give: WAIT_TIMEOUT.
COMPAT_TOKENS = 200
SHORT_GRACE = 3.0
JOB_ID = "X-Streampool-Job-Id"


@dataclass
class StoppingGateway:
    """The gateway a test stops, and a client of it."""

    processes: Processes
    process: Popen[bytes]
    port: int
    http: httpx.AsyncClient

    def terminate(self) -> None:
        self.processes.signal("gateway", signal.SIGTERM)

    async def exit_code(self) -> int:
        return await asyncio.to_thread(self.process.wait, WAIT_TIMEOUT)

    async def submitted(self) -> float:
        """How many jobs this gateway has accepted, by its metrics."""
        families = text_string_to_metric_families((await self.http.get("/metrics")).text)
        samples = [sample for family in families for sample in family.samples]
        return next(sample.value for sample in samples if sample.name == "streampool_jobs_submitted_total")


@pytest.fixture
async def stopping(
    synthetic_system: System, tmp_path: Path, request: pytest.FixtureRequest
) -> AsyncIterator[StoppingGateway]:
    """The gateway, with the system's settings or (parametrized indirectly) a grace period of the test's."""
    grace = getattr(request, "param", synthetic_system.settings.shutdown_grace_seconds)
    update = {"port": free_port(), "shutdown_grace_seconds": grace}
    settings = synthetic_system.settings.model_copy(update=update)
    processes = Processes(tmp_path)
    process = processes.start("gateway", "gateway", settings)
    base_url = f"http://127.0.0.1:{settings.port}"
    try:
        healthy = await asyncio.to_thread(wait_healthy, base_url, [process], WORKERS, SYSTEM_START_TIMEOUT)
        assert healthy, f"the gateway did not start; log in {tmp_path}"
        async with httpx.AsyncClient(base_url=base_url, timeout=120) as http:
            yield StoppingGateway(processes, process, settings.port, http)
    finally:
        await asyncio.to_thread(processes.stop_all)


async def test_sigterm_ends_open_streams_at_once_and_each_client_resumes_elsewhere_without_a_gap(
    synthetic_client: httpx.AsyncClient, stopping: StoppingGateway
) -> None:
    # A minute each: both jobs outlast the cut.
    jobs = [
        await submit(synthetic_client, prompt=LONG_PROMPT, max_tokens=2000, temperature=0) for _ in range(2)
    ]
    followed = [jobs[0], jobs[0], jobs[1]]  # two clients of one job, one of the other
    received: list[Received] = [[] for _ in followed]
    readers = [
        asyncio.create_task(read_sse(stopping.http, job_id, into=into))
        for job_id, into in zip(followed, received, strict=True)
    ]

    async def all_streaming() -> bool:
        return all(len(deltas([event for _, event in into])) >= 3 for into in received)

    await eventually(all_streaming, "the clients receive events", WAIT_TIMEOUT)
    assert [(await record(synthetic_client, job_id))["status"] for job_id in jobs] == ["running", "running"]
    stopping.terminate()
    cut = await asyncio.wait_for(asyncio.gather(*readers), WAIT_TIMEOUT)
    cut_at = datetime.now(timezone.utc)
    # The streams ended while their jobs still ran (the clock of this machine, not a speed)...
    for job_id in jobs:
        finished_at = (await record(synthetic_client, job_id)).get("finished_at")
        assert finished_at is None or datetime.fromisoformat(finished_at) > cut_at
    # ...and the gateway exited.
    assert await stopping.exit_code() == -signal.SIGTERM
    for job_id in jobs:  # the clients resume while the jobs run, and follow them to their end
        assert (await synthetic_client.post(f"/v1/jobs/{job_id}/cancel")).status_code == 202

    for job_id, before in zip(followed, cut, strict=True):
        assert not TERMINAL & {event["type"] for _, event in before}
        rest = await read_sse(synthetic_client, job_id, last_event_id=before[-1][0])
        assert rest[-1][1]["type"] == "cancelled"
        assert_one_seamless_stream([event for _, event in before + rest])
        whole = await read_sse(synthetic_client, job_id)
        assert [stream_id for stream_id, _ in before + rest] == [stream_id for stream_id, _ in whole]


async def refuses_connections(port: int) -> bool:
    try:
        _, writer = await asyncio.open_connection("127.0.0.1", port)
    except ConnectionRefusedError:
        return True
    writer.close()
    await writer.wait_closed()
    return False


async def test_a_stopping_gateway_refuses_new_connections_and_answers_the_requests_it_has(
    synthetic_system: System, stopping: StoppingGateway
) -> None:
    body = {
        "model": synthetic_system.settings.model_name,
        "prompt": LONG_PROMPT,
        "max_tokens": 200,
        "temperature": 0,
    }
    # A whole completion in one answer: in flight until its job ends.
    answering = asyncio.create_task(stopping.http.post("/v1/completions", json=body))

    async def submitted() -> bool:
        return await stopping.submitted() == 1

    await eventually(submitted, "the completion's job is submitted", WAIT_TIMEOUT)
    stopping.terminate()
    await eventually(
        lambda: refuses_connections(stopping.port), "the gateway refuses connections", WAIT_TIMEOUT
    )
    assert not answering.done()
    assert stopping.process.poll() is None

    answer = await asyncio.wait_for(answering, WAIT_TIMEOUT)
    assert answer.status_code == 200, answer.text
    completion = answer.json()
    assert completion["choices"][0]["finish_reason"] in ("stop", "length")
    assert completion["choices"][0]["text"]
    assert completion["usage"]["completion_tokens"] > 0
    assert await stopping.exit_code() == -signal.SIGTERM


async def read_openai(
    client: openai.AsyncOpenAI, model: str, max_tokens: int, into: list[Completion], started: asyncio.Event
) -> None:
    """A streamed OpenAI completion of `COUNTING`, chunk by chunk `into` the list; `started` is set once
    the answer has begun (its job admitted)."""
    stream = await client.completions.create(
        model=model,
        prompt=COUNTING,
        max_tokens=max_tokens,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    started.set()
    async for chunk in stream:
        into.append(chunk)


@pytest.mark.parametrize("stopping", [WAIT_TIMEOUT], indirect=True)  # see COMPAT_TOKENS
async def test_sigterm_lets_openai_and_tgi_streams_finish_while_native_streams_end_at_once(
    synthetic_system: System, synthetic_client: httpx.AsyncClient, stopping: StoppingGateway
) -> None:
    base_url = f"http://127.0.0.1:{stopping.port}"
    chunks: list[Completion] = []
    outputs: list[TextGenerationStreamOutput] = []
    native: Received = []
    followed = await submit(synthetic_client, prompt=LONG_PROMPT, max_tokens=2000, temperature=0)
    async with (
        openai.AsyncOpenAI(base_url=f"{base_url}/v1", api_key="none", max_retries=0) as openai_client,
        AsyncInferenceClient(base_url) as tgi_client,
    ):
        started = [asyncio.Event(), asyncio.Event()]

        async def read_tgi() -> None:
            stream = await tgi_client.text_generation(
                COUNTING, max_new_tokens=COMPAT_TOKENS, stream=True, details=True
            )
            started[1].set()
            async for output in stream:
                outputs.append(output)

        compat = [
            asyncio.create_task(
                read_openai(
                    openai_client, synthetic_system.settings.model_name, COMPAT_TOKENS, chunks, started[0]
                ),
                name="openai",
            ),
            asyncio.create_task(read_tgi(), name="tgi"),
        ]
        following = asyncio.create_task(read_sse(stopping.http, followed, into=native))

        async def all_answering() -> bool:
            return all(event.is_set() for event in started) and len(native) > 0

        # As soon as every answer has begun: no compat answer may be over before the signal.
        await eventually(all_answering, "every answer begins", WAIT_TIMEOUT)
        stopping.terminate()
        cut = await asyncio.wait_for(following, WAIT_TIMEOUT)
        # The native stream ended without its end (its client resumes elsewhere), while the others go on.
        assert not TERMINAL & {event["type"] for _, event in cut}
        ended = {task.get_name(): task for task in compat if task.done()}
        assert not ended, f"ended before the native stream was cut: {ended} ({len(chunks)}, {len(outputs)})"
        assert stopping.process.poll() is None
        await asyncio.wait_for(asyncio.gather(*compat), WAIT_TIMEOUT)
    assert await stopping.exit_code() == -signal.SIGTERM
    # The gateway's stop left the native job alone (it still runs: a minute long); then it is not needed.
    assert (await record(synthetic_client, followed))["status"] == "running"
    await synthetic_client.post(f"/v1/jobs/{followed}/cancel")

    # OpenAI's whole answer: every token of the job, its finish reason, its usage.
    text = "".join(chunk.choices[0].text for chunk in chunks if chunk.choices)
    finish_reasons = [chunk.choices[0].finish_reason for chunk in chunks if chunk.choices]
    job = await record(synthetic_client, chunks[0].id.removeprefix("cmpl-"))
    assert job["status"] == "completed"
    assert text == job["output"]["text"] != ""
    assert finish_reasons[-1] == job["finish_reason"]
    assert chunks[-1].usage is not None
    assert chunks[-1].usage.completion_tokens == job["usage"]["completion_tokens"]
    # TGI's: one event per token, the last with the whole text and the finish reason.
    last = outputs[-1]
    assert last.details is not None
    assert last.details.finish_reason in ("length", "eos_token", "stop_sequence")
    assert last.details.generated_tokens == len(outputs)
    assert last.generated_text == "".join(output.token.text for output in outputs) != ""


async def read_stored_chat(
    client: openai.AsyncOpenAI, model: str, max_tokens: int, into: list[ChatCompletionChunk]
) -> None:
    """A streamed stored chat completion (`store: true`), chunk by chunk `into` the list."""
    stream = await client.chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": COUNTING}],
        max_tokens=max_tokens,
        stream=True,
        store=True,
    )
    async for chunk in stream:
        into.append(chunk)


@pytest.mark.parametrize("stopping", [SHORT_GRACE], indirect=True)
async def test_after_the_grace_period_compat_answers_are_cancelled_kept_ones_let_go_and_the_gateway_exits(
    synthetic_system: System, synthetic_client: httpx.AsyncClient, stopping: StoppingGateway
) -> None:
    base_url = f"http://127.0.0.1:{stopping.port}"
    chunks: list[Completion] = []
    kept: list[ChatCompletionChunk] = []
    whole_context = 2000  # a minute: far longer than the grace period
    kept_tokens = 300  # 9 s: longer than the grace period, within the test's time
    model = synthetic_system.settings.model_name
    async with openai.AsyncOpenAI(base_url=f"{base_url}/v1", api_key="none", max_retries=0) as openai_client:
        streaming = asyncio.create_task(
            read_openai(openai_client, model, whole_context, chunks, asyncio.Event())
        )
        keeping = asyncio.create_task(read_stored_chat(openai_client, model, kept_tokens, kept))
        body = {"inputs": COUNTING, "parameters": {"max_new_tokens": whole_context}}
        answering = asyncio.create_task(stopping.http.post("/generate", json=body))

        async def all_running() -> bool:
            return len(chunks) >= 1 and len(kept) >= 1 and await stopping.submitted() == 3

        await eventually(all_running, "the streams and the waiting answer have their jobs", WAIT_TIMEOUT)
        clock = asyncio.get_running_loop().time
        stopping.terminate()
        stopped_at = clock()
        with pytest.raises(openai.APIError, match="cancelled"):
            await asyncio.wait_for(streaming, WAIT_TIMEOUT)
        streamed_for = clock() - stopped_at
        answer = await asyncio.wait_for(answering, WAIT_TIMEOUT)
        answered_for = clock() - stopped_at
        with pytest.raises(openai.APIError, match="this gateway is stopping before the job's end"):
            await asyncio.wait_for(keeping, WAIT_TIMEOUT)
    # Not cut at once: all went on through the grace period.
    assert streamed_for >= SHORT_GRACE and answered_for >= SHORT_GRACE
    assert await stopping.exit_code() == -signal.SIGTERM

    # The stored chat's job went on: resumed through the other gateway after the chunks its client had,
    # it gives the rest of the answer.
    async with openai.AsyncOpenAI(
        base_url=f"{synthetic_system.base_url}/v1", api_key="none", max_retries=0
    ) as elsewhere:
        path = f"/chat/completions/{kept[0].id}/chunks"
        rest = await resumed_chunks(elsewhere, path, ChatCompletionChunk, len(kept))
    job = await record(synthetic_client, kept[0].id.removeprefix("chatcmpl-"))
    assert (job["status"], job["output"]["token_count"]) == ("completed", kept_tokens)
    text = "".join(chunk.choices[0].delta.content or "" for chunk in kept + rest if chunk.choices)
    assert text == job["output"]["text"]

    # Each ended as a job cancelled under its client does: the stream with an error chunk (before
    # [DONE]), the waiting answer with TGI's status for it; both jobs are `cancelled`.
    assert answer.status_code == 500, answer.text
    assert "cancelled" in answer.json()["error"]
    for job_id in (chunks[0].id.removeprefix("cmpl-"), answer.headers[JOB_ID]):
        assert (await record(synthetic_client, job_id))["status"] == "cancelled"
