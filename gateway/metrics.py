"""The gateway's Prometheus metrics, and the queue's figures read from Redis at scrape time."""

from __future__ import annotations

import asyncio
import logging
import time
from bisect import bisect_left
from collections.abc import Iterator
from itertools import accumulate

import redis.asyncio as aioredis
from prometheus_client import CollectorRegistry, Counter, Gauge
from prometheus_client.core import GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString
from redis.exceptions import RedisError

from shared.errors import BackendUnavailable
from shared.keys import Keys
from shared.redis_client import redis_errors

log = logging.getLogger(__name__)

REJECT_REASONS = ("overloaded", "prompt_too_long", "body_too_large", "unauthorized")
# From a millisecond (a relay keeping up) to ten seconds (a gateway far behind, or a replay).
RELAY_LAG_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
# A scrape must answer even while Redis hangs: the queue's figures are left out instead.
QUEUE_READ_TIMEOUT_SECONDS = 2.0


class QueueFigures(Collector):
    """`streampool_queue_depth` and `streampool_jobs{state}` as last read from Redis; nothing when
    the last read failed, so that a dashboard shows a gap rather than a stale figure."""

    def __init__(self) -> None:
        self.queued_and_running: tuple[int, int] | None = None

    def collect(self) -> Iterator[Metric]:
        if self.queued_and_running is None:
            return
        queued, running = self.queued_and_running
        yield GaugeMetricFamily("streampool_queue_depth", "Jobs waiting for a worker", value=queued)
        jobs = GaugeMetricFamily(
            "streampool_jobs",
            "Jobs per state: queued (waiting), running (held by a worker)",
            labels=["state"],
        )
        jobs.add_metric(["queued"], queued)
        jobs.add_metric(["running"], running)
        yield jobs


class RelayLag(Collector):
    """`streampool_relay_lag_seconds`, observed once per SSE write: thousands of times a second.

    prometheus_client's Histogram takes a lock and checks its buckets one by one at every
    observation (under cProfile at 10,000 events/s, 14 % of the time spent writing events);
    this one counts into a list by bisection (the gateway observes from its one event loop
    thread) and makes the cumulative buckets only when scraped.
    """

    name = "streampool_relay_lag_seconds"
    documentation = (
        "From a worker's XADD (the entry id, by Redis's clock) to this gateway writing the entry to its "
        "SSE client, once per write, for the oldest entry written; replays of a backlog included"
    )

    def __init__(self) -> None:
        self.counts = [0] * (len(RELAY_LAG_BUCKETS) + 1)  # the last one: above every bound
        self.sum = 0.0

    def observe(self, seconds: float) -> None:
        seconds = max(0.0, seconds)  # clocks of Redis and the gateway may disagree a little
        self.counts[bisect_left(RELAY_LAG_BUCKETS, seconds)] += 1
        self.sum += seconds

    def collect(self) -> Iterator[Metric]:
        cumulative = list(accumulate(self.counts))
        bounds = [*map(floatToGoString, RELAY_LAG_BUCKETS), "+Inf"]
        buckets = list(zip(bounds, cumulative, strict=True))
        yield HistogramMetricFamily(self.name, self.documentation, buckets=buckets, sum_value=self.sum)


class GatewayMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
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
        self.streams_open = Gauge(
            "streampool_sse_streams_open", "SSE streams this gateway is relaying", registry=self.registry
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

    def observe_relay_lag(self, stream_id: str) -> None:
        """The lag of the entry `stream_id` (`<ms>-<seq>`), now that it has been handed over."""
        self.relay_lag.observe(time.time() - int(stream_id.partition("-")[0]) / 1000)

    async def read_queue(self, redis: aioredis.Redis, keys: Keys) -> None:
        """Read the queue's figures for this scrape; a Redis that fails leaves them out (and is logged)."""
        try:
            with redis_errors():
                async with redis.pipeline(transaction=False) as pipe:
                    pipe.zcard(keys.queue)
                    pipe.scard(keys.running)
                    queued, running = await asyncio.wait_for(pipe.execute(), QUEUE_READ_TIMEOUT_SECONDS)
        except (BackendUnavailable, RedisError, asyncio.TimeoutError) as exc:
            log.warning("metrics: the queue's figures are left out, Redis did not answer: %r", exc)
            self.queue.queued_and_running = None
            return
        self.queue.queued_and_running = (int(queued), int(running))
