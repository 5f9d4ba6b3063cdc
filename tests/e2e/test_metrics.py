"""Metrics on the real system: a completed and a cancelled job move the gateway's and the workers'
counters and histograms by exactly their amounts, and the workers say they are ready.

The system is shared by the whole session, so every figure is compared before and after this
test's own jobs, once nothing else runs.
"""

from __future__ import annotations

from dataclasses import dataclass

import httpx

from tests.conftest import System
from tests.helpers import LONG_PROMPT, Scrape, eventually, read_sse, scrape, submit

WAIT_SECONDS = 120


@dataclass
class Snapshot:
    """One scrape of the gateway and of every worker."""

    gateway: Scrape
    workers: list[Scrape]

    def workers_value(self, name: str, **labels: str) -> float:
        """A worker metric summed over the workers."""
        return sum(worker.value(name, **labels) for worker in self.workers)


async def snapshot(client: httpx.AsyncClient, system: System) -> Snapshot:
    workers = [await scrape(client, f"{url}/metrics") for url in system.worker_urls]
    return Snapshot(await scrape(client), workers)


async def idle_snapshot(client: httpx.AsyncClient, system: System) -> Snapshot:
    """A snapshot once no job is queued or running (jobs of earlier tests may still be ending)."""

    def idle(now: Snapshot) -> bool:
        busy = now.gateway.value("streampool_queue_depth") + now.gateway.value(
            "streampool_jobs", state="running"
        )
        return busy == 0 and now.workers_value("streampool_worker_jobs_running") == 0

    what = "jobs of earlier tests end"
    return await eventually(lambda: snapshot(client, system), what, WAIT_SECONDS, 0.2, until=idle)


async def snapshot_when(
    client: httpx.AsyncClient, system: System, before: Snapshot, finished: dict[str, int]
) -> Snapshot:
    """A snapshot once the workers count `finished` more jobs per final state than `before`: a worker
    counts a job just after its terminal event is written, which a client may read first."""

    def counted(now: Snapshot) -> bool:
        return all(
            now.workers_value("streampool_worker_jobs_finished_total", state=state)
            - before.workers_value("streampool_worker_jobs_finished_total", state=state)
            >= count
            for state, count in finished.items()
        )

    what = f"the workers count {finished} more finished jobs"
    return await eventually(lambda: snapshot(client, system), what, WAIT_SECONDS, 0.2, until=counted)


async def test_a_completed_and_a_cancelled_job_move_the_metrics_by_their_amounts(
    client: httpx.AsyncClient, system: System
) -> None:
    before = await idle_snapshot(client, system)
    completed = await submit(client, prompt="Hi", max_tokens=8, temperature=0)
    assert (await read_sse(client, completed))[-1][1]["type"] == "done"

    cancelled = await submit(client, prompt=LONG_PROMPT, max_tokens=1000, temperature=0)
    seen = await read_sse(client, cancelled, stop_after=5)  # queued, running, 3 deltas
    assert (await client.post(f"/v1/jobs/{cancelled}/cancel")).status_code == 202
    assert (await read_sse(client, cancelled, last_event_id=seen[-1][0]))[-1][1]["type"] == "cancelled"
    after = await snapshot_when(client, system, before, {"completed": 1, "cancelled": 1})

    def gateway(name: str, **labels: str) -> float:
        return after.gateway.value(name, **labels) - before.gateway.value(name, **labels)

    def workers(name: str, **labels: str) -> float:
        return after.workers_value(name, **labels) - before.workers_value(name, **labels)

    records = [(await client.get(f"/v1/jobs/{job_id}")).json() for job_id in (completed, cancelled)]
    assert [record["status"] for record in records] == ["completed", "cancelled"]
    tokens = sum(record["usage"]["completion_tokens"] for record in records)

    assert gateway("streampool_jobs_submitted_total") == 2
    assert gateway("streampool_http_requests_total", route="/v1/jobs", status="202") == 2
    assert gateway("streampool_http_requests_total", route="/v1/jobs/{job_id}/cancel", status="202") == 1
    assert gateway("streampool_relay_lag_seconds_count") > 0
    assert {"streampool_queue_depth", "streampool_jobs"} <= after.gateway.names()

    assert workers("streampool_generated_tokens_total") == tokens
    assert workers("streampool_worker_jobs_finished_total", state="completed") == 1
    assert workers("streampool_worker_jobs_finished_total", state="cancelled") == 1
    assert workers("streampool_worker_jobs_finished_total", state="failed") == 0
    assert workers("streampool_time_to_first_token_seconds_count") == 2
    assert workers("streampool_inter_token_latency_seconds_count") > 0
    assert workers("streampool_e2e_latency_seconds_count") == 2
    assert workers("streampool_cancels_total") == 1
    assert workers("streampool_cancel_latency_seconds_count") == 1
    assert workers("streampool_resumes_total") == 0


async def test_every_worker_is_ready_on_its_health_port(client: httpx.AsyncClient, system: System) -> None:
    for url in system.worker_urls:
        answer = await client.get(f"{url}/health")
        assert answer.status_code == 200, answer.text
        assert answer.json()["status"] == "ready"
