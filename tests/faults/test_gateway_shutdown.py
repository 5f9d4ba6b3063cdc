"""A gateway told to stop (SIGTERM) ends its open event streams at once, without a terminal event,
so that each client resumes from its last `id:` with `Last-Event-ID` on another gateway and misses
nothing; it accepts no new connection from then on, and answers the requests it already has.

The gateway stopped here is a process of the test's own on the pool's settings (the same Redis and
workers); the pool's gateway, left running, is the one clients move to.
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
import pytest
from prometheus_client.parser import text_string_to_metric_families

from shared.launcher import wait_healthy
from tests.conftest import SYSTEM_START_TIMEOUT
from tests.faults.conftest import (
    WAIT_TIMEOUT,
    WORKERS,
    Pool,
    assert_one_seamless_stream,
    record,
    wait_for,
)
from tests.helpers import LONG_PROMPT, TERMINAL, deltas, read_sse, submit
from tests.processes import Processes, free_port

Received = list[tuple[str, dict[str, Any]]]


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
async def stopping(pool: Pool, tmp_path: Path) -> AsyncIterator[StoppingGateway]:
    pool.ensure_workers()
    settings = pool.settings.model_copy(update={"port": free_port()})
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
    pool: Pool, client: httpx.AsyncClient, stopping: StoppingGateway
) -> None:
    # As long as the context allows: two workers on one small machine can run at very different
    # speeds (vLLM binds both model runners to the same cores), and both jobs must outlast the cut.
    jobs = [await submit(client, prompt=LONG_PROMPT, max_tokens=2000, temperature=0) for _ in range(2)]
    followed = [jobs[0], jobs[0], jobs[1]]  # two clients of one job, one of the other
    received: list[Received] = [[] for _ in followed]
    readers = [
        asyncio.create_task(read_sse(stopping.http, job_id, into=into))
        for job_id, into in zip(followed, received, strict=True)
    ]

    async def all_streaming() -> bool:
        return all(len(deltas([event for _, event in into])) >= 3 for into in received)

    await wait_for(all_streaming, "the clients did not receive events")
    assert [(await record(client, job_id))["status"] for job_id in jobs] == ["running", "running"]
    stopping.terminate()
    cut = await asyncio.wait_for(asyncio.gather(*readers), WAIT_TIMEOUT)
    cut_at = datetime.now(timezone.utc)
    # The streams ended while their jobs still ran (the clock of this machine, not a speed)...
    for job_id in jobs:
        finished_at = (await record(client, job_id)).get("finished_at")
        assert finished_at is None or datetime.fromisoformat(finished_at) > cut_at
    # ...and the gateway exited.
    assert await stopping.exit_code() == -signal.SIGTERM
    for job_id in jobs:  # the clients resume while the jobs run, and follow them to their end
        assert (await client.post(f"/v1/jobs/{job_id}/cancel")).status_code == 202

    for job_id, before in zip(followed, cut, strict=True):
        assert not TERMINAL & {event["type"] for _, event in before}
        rest = await read_sse(client, job_id, last_event_id=before[-1][0])
        assert rest[-1][1]["type"] == "cancelled"
        assert_one_seamless_stream([event for _, event in before + rest])
        whole = await read_sse(client, job_id)
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
    pool: Pool, stopping: StoppingGateway
) -> None:
    body = {"model": pool.settings.model_name, "prompt": LONG_PROMPT, "max_tokens": 200, "temperature": 0}
    # A whole completion in one answer: in flight until its job ends.
    answering = asyncio.create_task(stopping.http.post("/v1/completions", json=body))

    async def submitted() -> bool:
        return await stopping.submitted() == 1

    await wait_for(submitted, "the completion's job was not submitted")
    stopping.terminate()
    await wait_for(lambda: refuses_connections(stopping.port), "the gateway still accepts connections")
    assert not answering.done()
    assert stopping.process.poll() is None

    answer = await asyncio.wait_for(answering, WAIT_TIMEOUT)
    assert answer.status_code == 200, answer.text
    completion = answer.json()
    assert completion["choices"][0]["finish_reason"] in ("stop", "length")
    assert completion["choices"][0]["text"]
    assert completion["usage"]["completion_tokens"] > 0
    assert await stopping.exit_code() == -signal.SIGTERM
