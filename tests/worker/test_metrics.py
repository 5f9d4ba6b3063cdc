"""The worker's /health and /metrics server, on a real socket: what it answers before and after the
worker is ready, on other paths, to a request that is no HTTP, and to a client that does not wait."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable

import httpx
import pytest
from prometheus_client import CollectorRegistry, Counter, Gauge

from tests.helpers import scrape
from tests.processes import free_port
from worker.metrics import MetricsServer, Readiness, WorkerMetrics


class Switch:
    """The readiness a test sets, as the worker's state would."""

    def __init__(self) -> None:
        self.readiness = Readiness.starting


Serve = Callable[..., MetricsServer]


@pytest.fixture
async def serve() -> AsyncIterator[Serve]:
    """Starts servers on free ports on this machine; closes them afterwards."""
    servers: list[MetricsServer] = []

    def start(metrics: WorkerMetrics, switch: Switch, **options: float) -> MetricsServer:
        server = MetricsServer(
            metrics.registry, lambda: switch.readiness, free_port(), "127.0.0.1", **options
        )
        server.start()
        servers.append(server)
        return server

    yield start
    for server in servers:
        await server.close()


def client(server: MetricsServer) -> httpx.AsyncClient:
    return httpx.AsyncClient(base_url=f"http://127.0.0.1:{server.port}", timeout=10)


async def test_health_is_503_while_starting_and_draining_and_200_when_ready(serve: Serve) -> None:
    switch = Switch()
    async with client(serve(WorkerMetrics("smol"), switch)) as http:
        answer = await http.get("/health")
        assert (answer.status_code, answer.json()["status"]) == (503, "starting")
        switch.readiness = Readiness.ready
        answer = await http.get("/health")
        assert (answer.status_code, answer.json()["status"]) == (200, "ready")
        switch.readiness = Readiness.draining
        answer = await http.get("/health")
    assert (answer.status_code, answer.json()["status"]) == (503, "draining")
    assert "no new jobs" in answer.json()["detail"]


async def test_a_ready_worker_whose_event_loop_stopped_running_is_503_stalled(serve: Serve) -> None:
    switch = Switch()
    switch.readiness = Readiness.ready
    # No allowance at all: the loop's last turn is always longer ago than that.
    async with client(serve(WorkerMetrics("smol"), switch, stall_seconds=0.0)) as http:
        answer = await http.get("/health")
    assert (answer.status_code, answer.json()["status"]) == (503, "stalled")


async def test_metrics_are_prometheus_text(serve: Serve) -> None:
    metrics = WorkerMetrics("smol")
    metrics.generated_tokens.inc(7)
    async with client(serve(metrics, Switch())) as http:
        scraped = await scrape(http, "/metrics?name[]=ignored")
    assert scraped.value("streampool_generated_tokens_total") == 7
    assert scraped.value("streampool_worker_jobs_finished_total", state="completed") == 0


async def test_other_paths_are_404_and_other_methods_refused(serve: Serve) -> None:
    async with client(serve(WorkerMetrics("smol"), Switch())) as http:
        assert (await http.get("/v1/jobs")).status_code == 404
        assert (await http.get("/healthz")).status_code == 404
        assert (await http.post("/health")).status_code == 501


async def test_a_request_that_is_no_http_gets_an_error_and_the_server_serves_on(serve: Serve) -> None:
    server = serve(WorkerMetrics("smol"), Switch())
    reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
    writer.write(b"\xff\xfe hello\r\n\r\n")
    await writer.drain()
    assert b"Error response" in await reader.read()
    writer.close()
    await writer.wait_closed()
    async with client(server) as http:
        assert (await http.get("/health")).status_code == 503


async def test_a_client_that_leaves_before_its_answer_costs_no_traceback(
    capsys: pytest.CaptureFixture[str],
) -> None:
    def slow() -> Readiness:  # as /health answers while vLLM's loading holds the GIL
        time.sleep(0.5)
        return Readiness.starting

    server = MetricsServer(WorkerMetrics("smol").registry, slow, free_port(), "127.0.0.1")
    server.start()
    try:
        for _ in range(3):  # a probe that gave up: it asked, then closed its end
            _, writer = await asyncio.open_connection("127.0.0.1", server.port)
            writer.write(b"GET /health HTTP/1.1\r\nHost: worker\r\n\r\n")
            await writer.drain()
            writer.close()
            await writer.wait_closed()
        await asyncio.sleep(1.5)  # every answer written to a closed connection by now
        async with client(server) as http:
            assert (await http.get("/health")).status_code == 503
    finally:
        await server.close()
    assert "Traceback" not in capsys.readouterr().err


async def test_redis_round_trips_are_read_from_their_counter_at_each_scrape(serve: Serve) -> None:
    metrics = WorkerMetrics("smol")
    counted = [3]
    metrics.count_redis_round_trips(lambda: counted[0])
    async with client(serve(metrics, Switch())) as http:
        first = await scrape(http)
        counted[0] = 11
        second = await scrape(http)
    assert first.value("streampool_worker_redis_round_trips_total") == 3
    assert second.value("streampool_worker_redis_round_trips_total") == 11


async def test_vllms_own_series_are_served_beside_streampools_and_read_at_each_scrape(serve: Serve) -> None:
    # A registry of vLLM's shape stands in for the default one a real engine fills (tests/e2e: the real one).
    engine = CollectorRegistry()
    labels = {"model_name": "smol", "engine": "0"}
    tokens = Counter("vllm:generation_tokens", "tokens", list(labels), registry=engine).labels(**labels)
    waiting = Gauge("vllm:num_requests_waiting", "waiting", list(labels), registry=engine).labels(**labels)
    Counter("process_unrelated", "not the engine's", registry=engine).inc()
    metrics = WorkerMetrics("smol", engine_registry=engine)
    metrics.generated_tokens.inc(5)
    tokens.inc(5)
    waiting.set(2)
    async with client(serve(metrics, Switch())) as http:
        first = await scrape(http)
        waiting.set(0)
        second = await scrape(http)
    assert first.value("vllm:generation_tokens_total", **labels) == 5
    assert first.value("streampool_generated_tokens_total") == 5
    assert (
        first.value("vllm:num_requests_waiting", **labels),
        second.value("vllm:num_requests_waiting"),
    ) == (2, 0)
    assert "process_unrelated_total" not in first.names()


async def test_a_worker_without_a_vllm_engine_serves_no_vllm_series(serve: Serve) -> None:
    async with client(serve(WorkerMetrics("smol", engine_registry=CollectorRegistry()), Switch())) as http:
        names = (await scrape(http)).names()
    assert "streampool_generated_tokens_total" in names
    assert not [name for name in names if name.startswith("vllm:")]
