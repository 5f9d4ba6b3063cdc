"""The gateway's Prometheus metrics, and the queue's figures read from Redis at scrape time.

The series that name a tenant live in a registry of their own, served only to the operator (the
metrics token): /metrics answers on the public port, and a tenant's name, jobs and tokens are no
other tenant's to read.
"""

from __future__ import annotations

import asyncio
import logging
import time
from bisect import bisect_left
from collections.abc import Awaitable, Callable, Iterator
from itertools import accumulate

from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString
from redis.exceptions import RedisError

from shared.errors import BackendUnavailable

log = logging.getLogger(__name__)

REJECT_REASONS = (
    "overloaded",
    "rate_limited",
    "redis_memory",
    "prompt_too_long",
    "body_too_large",
    "unauthorized",
)
# From a millisecond (a relay keeping up) to ten seconds (a gateway far behind, or a replay).
RELAY_LAG_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
# A scrape must answer even while Redis hangs: the queue's figures are left out instead.
QUEUE_READ_TIMEOUT_SECONDS = 2.0


QueueRead = Callable[[], Awaitable[tuple[dict[str, tuple[int, int]], dict[str, str], dict[str, str] | None]]]
"""Reads each model's (queued, running) job counts, the jobs each model's deadlines ended
(`Keys.jobs_expired`), and the tenants' totals (`Keys.tenant_totals`; None where the scrape will not
show them)."""


class QueueFigures(Collector):
    """`streampool_queue_depth{model}`, `streampool_jobs{model,state}` and
    `streampool_jobs_expired_total{model}` as last read from Redis; nothing when the last read failed,
    so that a dashboard shows a gap rather than a stale figure."""

    def __init__(self) -> None:
        self.by_model: dict[str, tuple[int, int]] | None = None
        self.expired: dict[str, str] = {}

    def collect(self) -> Iterator[Metric]:
        if self.by_model is None:
            return
        depth = GaugeMetricFamily(
            "streampool_queue_depth", "Jobs waiting for a worker, per model", labels=["model"]
        )
        jobs = GaugeMetricFamily(
            "streampool_jobs",
            "Jobs per model and state: queued (waiting), running (as the model's workers' heartbeats "
            "last said)",
            labels=["model", "state"],
        )
        for model, (queued, running) in sorted(self.by_model.items()):
            depth.add_metric([model], queued)
            jobs.add_metric([model, "queued"], queued)
            jobs.add_metric([model, "running"], running)
        expired = CounterMetricFamily(
            "streampool_jobs_expired",
            "Jobs that failed unrun because their deadline passed while they were queued "
            "(deadline_exceeded), per model, whichever gateway or worker ended them",
            labels=["model"],
        )
        for model in sorted(self.by_model):
            expired.add_metric([model], int(self.expired.get(model, 0)))
        yield depth
        yield jobs
        yield expired


class TenantTotals(Collector):
    """`streampool_tenant_tokens_total` and `streampool_tenant_jobs_ended_total` per tenant, as the
    lifecycle scripts count them in Redis for every gateway and worker (`Keys.tenant_totals`): the
    same figures from any gateway; nothing when the last read failed."""

    def __init__(self) -> None:
        self.totals: dict[str, str] | None = None

    def collect(self) -> Iterator[Metric]:
        if self.totals is None:
            return
        about = "Prompt plus generated tokens of ended jobs, per tenant"
        tokens = CounterMetricFamily("streampool_tenant_tokens", about, labels=["tenant"])
        jobs = CounterMetricFamily("streampool_tenant_jobs_ended", "Jobs ended per tenant", labels=["tenant"])
        for field, value in sorted(self.totals.items()):
            tenant, _, kind = field.rpartition(":")
            (tokens if kind == "tokens" else jobs).add_metric([tenant], int(value))
        yield tokens
        yield jobs


class RelayLag(Collector):
    """`streampool_relay_lag_seconds`: thousands of observations a second.

    What is sampled: each write a stream's own task makes (a catch-up, a batch it was woken for), for
    the batch's oldest entry; and once per notice (one worker's step) for the entries the stream hub
    wrote to clients from it, the last one's lag, taken after the last write (the step's entries share
    one `at`, so that is the step's worst). A step's 500 live writes are one sample, not 500: at 1,000
    SSE streams, observing each put the gateway at about 23 µs of CPU per event rather than 20.

    prometheus_client's Histogram takes a lock and checks its buckets one by one at every
    observation (under cProfile at 10,000 events/s, 14 % of the time spent writing events);
    this one counts into a list by bisection (the gateway observes from its one event loop
    thread) and makes the cumulative buckets only when scraped.
    """

    name = "streampool_relay_lag_seconds"
    documentation = (
        "From a worker's sending of a step (the entry's `at`, by the worker's clock) to this gateway "
        "writing the entry to its SSE client: once per write of a stream's task, for the oldest entry "
        "written (replays of a backlog included), and once per step for the entries written from its "
        "notice, for the last one written"
    )

    def __init__(self) -> None:
        self.counts = [0] * (len(RELAY_LAG_BUCKETS) + 1)  # the last one: above every bound
        self.sum = 0.0

    def observe(self, seconds: float) -> None:
        seconds = max(0.0, seconds)  # clocks of the worker and the gateway may disagree a little
        self.counts[bisect_left(RELAY_LAG_BUCKETS, seconds)] += 1
        self.sum += seconds

    def collect(self) -> Iterator[Metric]:
        cumulative = list(accumulate(self.counts))
        bounds = [*map(floatToGoString, RELAY_LAG_BUCKETS), "+Inf"]
        buckets = list(zip(bounds, cumulative, strict=True))
        yield HistogramMetricFamily(self.name, self.documentation, buckets=buckets, sum_value=self.sum)


class GatewayMetrics:
    """`registry`: the series any caller of /metrics gets; `tenant_registry`: those labelled by tenant."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.tenant_registry = CollectorRegistry()
        self.jobs_submitted = Counter(
            "streampool_jobs_submitted_total", "Jobs accepted by this gateway", registry=self.registry
        )
        self.jobs_rejected = Counter(
            "streampool_jobs_rejected_total",
            "Submissions refused, by reason (unauthorized: any POST without a valid key)",
            ["reason"],
            registry=self.registry,
        )
        for reason in REJECT_REASONS:
            self.jobs_rejected.labels(reason=reason)
        self.tenant_jobs_submitted = Counter(
            "streampool_tenant_jobs_submitted_total",
            "Jobs accepted by this gateway, per tenant (keys never label a metric)",
            ["tenant"],
            registry=self.tenant_registry,
        )
        self.tenant_jobs_rejected = Counter(
            "streampool_tenant_jobs_rejected_total",
            "Submissions refused by this gateway for a tenant's limit, per tenant and limit",
            ["tenant", "limit"],
            registry=self.tenant_registry,
        )
        self.tenant_totals = TenantTotals()
        self.tenant_registry.register(self.tenant_totals)
        self.streams_open = Gauge(
            "streampool_sse_streams_open", "SSE streams this gateway is relaying", registry=self.registry
        )
        # Every reader that holds a place against max_open_streams, not only the SSE streams above:
        # waiting polls and cursors, streamed OpenAI, TGI and Responses answers, cancels waiting.
        self.readers_open = Gauge(
            "streampool_readers_open",
            "Requests holding a place among this gateway's open readers (max_open_streams)",
            registry=self.registry,
        )
        self.relay_lag = RelayLag()
        self.registry.register(self.relay_lag)
        self.http_requests = Counter(
            "streampool_http_requests_total",
            "HTTP requests answered, by route template and status",
            ["route", "status"],
            registry=self.registry,
        )
        self.queue = QueueFigures()
        self.registry.register(self.queue)

    def latest(self, tenants: bool) -> bytes:
        """The text exposition of every series, those labelled by tenant only when `tenants`."""
        public = generate_latest(self.registry)
        return public + generate_latest(self.tenant_registry) if tenants else public

    def rejected_by_tenant(self, tenant: str, limit: str) -> None:
        """A submission refused for its tenant's `limit`."""
        self.jobs_rejected.labels(reason="rate_limited").inc()
        self.tenant_jobs_rejected.labels(tenant=tenant, limit=limit).inc()

    def observe_relay_lag(self, written_at: str) -> None:
        """The lag of an entry a step sent at `written_at` (its `at`, in ms), now that it has been
        written to its client (see `RelayLag` for what is sampled)."""
        self.relay_lag.observe(time.time() - int(written_at) / 1000)

    async def read_queue(self, read: QueueRead) -> None:
        """Read the queue's figures for this scrape; a Redis that fails leaves them out (and is logged)."""
        try:
            by_model, expired, totals = await asyncio.wait_for(read(), QUEUE_READ_TIMEOUT_SECONDS)
        except (BackendUnavailable, RedisError, asyncio.TimeoutError) as exc:
            log.warning("metrics: the queue's figures are left out, Redis did not answer: %r", exc)
            self.queue.by_model = None
            self.tenant_totals.totals = None
            return
        self.queue.by_model = by_model
        self.queue.expired = expired
        self.tenant_totals.totals = totals
