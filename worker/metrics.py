"""The worker's Prometheus metrics, and its small HTTP server on `metrics_port`: GET /metrics, GET /health.

One exposition carries streampool's `streampool_*` series and, on a vLLM worker, vLLM's own `vllm:*`
series for its engine, as `vllm serve` names and labels them.

The server is the standard library's, in a thread, rather than uvicorn: uvicorn takes over
SIGTERM and SIGINT, which belong to the worker's drain (signals reach only the main thread).
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
import time
from collections.abc import Callable, Iterator
from enum import Enum
from functools import partial
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    REGISTRY,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)
from prometheus_client.core import CounterMetricFamily, Metric
from prometheus_client.registry import Collector

from shared.events import JobState
from shared.jobstore import Started

log = logging.getLogger(__name__)

TICK_SECONDS = 1.0
READ_TIMEOUT_SECONDS = 5.0
STALL_SECONDS = 30.0  # the loop never blocks this long once the engine is up (jobs would stall too)
FINAL_STATES = (JobState.completed, JobState.cancelled, JobState.failed)
VLLM_PREFIX = "vllm:"
KV_CACHE_USAGE = "vllm:kv_cache_usage_perc"  # a gauge per engine: the share of its KV-cache blocks in use


class WorkerMetrics:
    """The metrics of one worker process. A worker serves one model: the job metrics carry its name
    as the `model` label, so that a dashboard over many workers splits them by model."""

    def __init__(self, model: str, engine_registry: CollectorRegistry = REGISTRY) -> None:
        self.model = model
        self.registry = CollectorRegistry()
        self.registry.register(VllmSeries(engine_registry))
        self.jobs_running = Gauge(
            "streampool_worker_jobs_running", "Jobs this worker runs now", ["model"], registry=self.registry
        ).labels(model=model)
        self.jobs_finished = Counter(
            "streampool_worker_jobs_finished_total",
            "Jobs this worker ended, by final state",
            ["model", "state"],
            registry=self.registry,
        )
        for state in FINAL_STATES:
            self.jobs_finished.labels(model=model, state=state.value)
        self.time_to_first_token = Histogram(
            "streampool_time_to_first_token_seconds",
            "From a job's submission to the engine's first token for it (queue wait plus prefill); "
            "first runs only",
            buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0),
            labelnames=["model"],
            registry=self.registry,
        ).labels(model=model)
        self.inter_token_latency = Histogram(
            "streampool_inter_token_latency_seconds",
            "Per engine output of a job after its first: the time since the job's previous output "
            "divided by the tokens the output brings",
            buckets=(0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1.0, 2.5, 5.0, 10.0),
            labelnames=["model"],
            registry=self.registry,
        ).labels(model=model)
        self.e2e_latency = Histogram(
            "streampool_e2e_latency_seconds",
            "From a job's submission to its last event, for the jobs this worker ended (any final state)",
            buckets=(
                0.1,
                0.25,
                0.5,
                1.0,
                2.5,
                5.0,
                10.0,
                20.0,
                30.0,
                60.0,
                120.0,
                300.0,
                600.0,
                1800.0,
                3600.0,
            ),
            labelnames=["model"],
            registry=self.registry,
        ).labels(model=model)
        self.generated_tokens = Counter(
            "streampool_generated_tokens_total",
            "Tokens this worker's engine generated",
            registry=self.registry,
        )
        self.cancels = Counter(
            "streampool_cancels_total", "Running jobs this worker stopped on a cancel", registry=self.registry
        )
        self.cancel_latency = Histogram(
            "streampool_cancel_latency_seconds",
            "From the cancel request (the gateway's clock) to the engine's abort of the job",
            buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0),
            labelnames=["model"],
            registry=self.registry,
        ).labels(model=model)
        self.resumes = Counter(
            "streampool_resumes_total",
            "Jobs this worker resumed after another worker stopped or lost them",
            registry=self.registry,
        )

    def count_redis_round_trips(self, read: Callable[[], int]) -> None:
        """Expose the publisher's round trips, counted by `read` at each scrape."""
        self.registry.register(RedisRoundTrips(read))

    def cancelled(self, asked_at: float | None) -> None:
        """A running job was aborted on a cancel asked for at `asked_at` (epoch seconds), if known."""
        self.cancels.inc()
        if asked_at is not None:
            self.cancel_latency.observe(max(0.0, time.time() - asked_at))


class RedisRoundTrips(Collector):
    """`streampool_worker_redis_round_trips_total`: the publisher keeps the count (one addition per
    pipeline on its hot path); this reads it when scraped. Its rate against the engine's step rate
    is the design's one round trip per step."""

    name = "streampool_worker_redis_round_trips"
    documentation = (
        "Pipelines this worker's publisher sent to Redis: one per engine step while jobs run, "
        "whatever their number (appends, cancel checks and job ends together)"
    )

    def __init__(self, read: Callable[[], int]) -> None:
        self.read = read

    def collect(self) -> Iterator[Metric]:
        yield CounterMetricFamily(self.name, self.documentation, value=self.read())


def kv_cache_usage(registry: CollectorRegistry = REGISTRY) -> float | None:
    """The fullest engine's KV-cache use (0 to 1) from vLLM's `vllm:kv_cache_usage_perc`; None until its
    stat logger has registered the gauge (a synthetic worker never does)."""
    values = [
        sample.value
        for family in registry.collect()
        if family.name == KV_CACHE_USAGE
        for sample in family.samples
    ]
    return max(values) if values else None


def counted(counter: Counter) -> int:
    """A counter's total, as a scrape reads it."""
    return int(
        sum(
            sample.value
            for family in counter.collect()
            for sample in family.samples
            if sample.name.endswith("_total")
        )
    )


class VllmSeries(Collector):
    """vLLM's own series (`vllm:num_requests_waiting`, `vllm:generation_tokens_total`...), read at each
    scrape from the registry its `PrometheusStatLogger` fills: the process's default one, as `vllm serve`
    serves it. Only the `vllm:` families: the default registry's process and GC collectors are not
    the engine's. A synthetic worker never builds that logger, so it yields nothing."""

    def __init__(self, source: CollectorRegistry) -> None:
        self.source = source

    def collect(self) -> Iterator[Metric]:
        return (family for family in self.source.collect() if family.name.startswith(VLLM_PREFIX))


class RunClock:
    """The timings of one run of one job, observed as the engine's outputs for it arrive."""

    def __init__(self, metrics: WorkerMetrics, started: Started) -> None:
        self.metrics = metrics
        self.submitted_at = started.submitted_at
        self.resumed = started.resumed
        self._previous: float | None = None

    def output(self, tokens: int) -> None:
        """An engine output with `tokens` new tokens."""
        if not tokens:
            return
        now = time.monotonic()
        if self._previous is not None:
            self.metrics.inter_token_latency.observe((now - self._previous) / tokens)
        elif not self.resumed:  # a resumed job's first token came from an earlier run
            self.metrics.time_to_first_token.observe(max(0.0, time.time() - self.submitted_at))
        self._previous = now
        self.metrics.generated_tokens.inc(tokens)

    def ended(self, state: JobState) -> None:
        """This worker wrote the job's terminal event."""
        self.metrics.jobs_finished.labels(model=self.metrics.model, state=state.value).inc()
        self.metrics.e2e_latency.observe(max(0.0, time.time() - self.submitted_at))


class Readiness(str, Enum):
    """What /health says: 200 only when `ready`."""

    ready = "ready"
    starting = "starting"
    draining = "draining"
    redis_unreachable = "redis_unreachable"
    stalled = "stalled"
    engine_dead = "engine_dead"


DETAILS = {
    Readiness.ready: "the engine is up and the worker takes jobs",
    Readiness.starting: "the engine is starting",
    Readiness.draining: "stopping: no new jobs; running ones finish or are handed over",
    Readiness.redis_unreachable: "Redis does not answer; the worker waits for it",
    Readiness.stalled: "the worker's event loop has stopped running",
    Readiness.engine_dead: "the engine died: running jobs are handed back and the worker exits",
}


class MetricsServer:
    """GET /metrics (Prometheus text) and GET /health (200 when ready, else 503 and why), on `port`.

    Served from a thread of its own, so that /health answers while loading the engine blocks the
    worker's event loop; a loop that stops running after that shows as `stalled`.
    """

    def __init__(
        self,
        registry: CollectorRegistry,
        readiness: Callable[[], Readiness],
        port: int,
        host: str,
        stall_seconds: float = STALL_SECONDS,
    ) -> None:
        self.registry = registry
        self.readiness = readiness
        self.port = port
        self.host = host
        self.stall_seconds = stall_seconds
        self.loop_ran_at = time.monotonic()
        self._httpd: ThreadingHTTPServer | None = None
        self._ticker: asyncio.Task[None] | None = None

    def start(self) -> None:
        """Listen, from the worker's event loop; a port that cannot be had is logged, and the worker
        runs on without the server."""
        self._ticker = asyncio.get_running_loop().create_task(self._tick(), name="loop-ticker")
        try:
            self._httpd = ThreadingHTTPServer((self.host, self.port), partial(_Handler, self))
        except OSError as exc:
            log.error("no /health or /metrics: cannot listen on %s:%d (%s)", self.host, self.port, exc)
            return
        self._httpd.daemon_threads = True
        threading.Thread(target=self._httpd.serve_forever, name="metrics-server", daemon=True).start()

    async def close(self) -> None:
        if self._ticker is not None:
            self._ticker.cancel()
        if self._httpd is not None:
            await asyncio.to_thread(self._httpd.shutdown)
            self._httpd.server_close()
            self._httpd = None

    async def _tick(self) -> None:
        while True:
            self.loop_ran_at = time.monotonic()
            await asyncio.sleep(TICK_SECONDS)

    def health(self) -> tuple[HTTPStatus, bytes]:
        readiness = self.readiness()
        if readiness is Readiness.ready and time.monotonic() - self.loop_ran_at > self.stall_seconds:
            readiness = Readiness.stalled
        status = HTTPStatus.OK if readiness is Readiness.ready else HTTPStatus.SERVICE_UNAVAILABLE
        return status, json.dumps({"status": readiness.value, "detail": DETAILS[readiness]}).encode()


class _Handler(BaseHTTPRequestHandler):
    """One request: /metrics, /health, or 404. Methods other than GET and HEAD get 501 (http.server)."""

    timeout = READ_TIMEOUT_SECONDS  # a client that sends nothing does not hold its thread for ever

    def __init__(self, server: MetricsServer, *args: Any) -> None:
        self.metrics_server = server
        super().__init__(*args)

    def _answer(self) -> tuple[HTTPStatus, str, bytes]:
        path = self.path.partition("?")[0]
        if path == "/metrics":
            return HTTPStatus.OK, CONTENT_TYPE_LATEST, generate_latest(self.metrics_server.registry)
        if path == "/health":
            status, body = self.metrics_server.health()
            return status, "application/json", body
        return HTTPStatus.NOT_FOUND, "text/plain", b"not found: /metrics and /health are served here\n"

    def _respond(self, with_body: bool) -> None:
        status, content_type, body = self._answer()
        try:
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            if with_body:
                self.wfile.write(body)
        except ConnectionError:  # no traceback in the log: a probe may give up while vLLM loads
            log.debug("metrics server: %s left before its answer", self.address_string())

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        self._respond(with_body=True)

    def do_HEAD(self) -> None:  # noqa: N802 - http.server's name
        self._respond(with_body=False)

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - http.server's signature
        log.debug("metrics server: " + format, *args)
