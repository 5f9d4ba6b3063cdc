"""The gateway's Prometheus metrics."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge


class GatewayMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.jobs_submitted = Counter(
            "streampool_jobs_submitted_total", "Jobs accepted by this gateway", registry=self.registry
        )
        self.jobs_rejected = Counter(
            "streampool_jobs_rejected_total", "Submissions refused", ["reason"], registry=self.registry
        )
        self.streams_open = Gauge(
            "streampool_sse_streams_open", "SSE streams this gateway is relaying", registry=self.registry
        )
