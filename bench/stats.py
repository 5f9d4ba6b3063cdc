"""Percentiles and per-stream timing records, shared by the engine and full-path phases (pure, no I/O)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100); NaN for no values, so a missing figure shows as such."""
    if not values:
        return math.nan
    ordered = sorted(values)
    rank = max(1, math.ceil(q / 100 * len(ordered)))
    return ordered[min(rank, len(ordered)) - 1]


@dataclass
class StreamTiming:
    """One generation as a client saw it: when it was asked for, when each batch of tokens arrived."""

    started: float
    arrivals: list[tuple[float, int]] = field(default_factory=list)  # (monotonic time, tokens)
    tokens: int = 0  # from usage or token_ids, never from frame counts

    def add(self, at: float, tokens: int) -> None:
        if tokens:
            self.arrivals.append((at, tokens))

    @property
    def ttft(self) -> float:
        return self.arrivals[0][0] - self.started if self.arrivals else math.nan

    @property
    def finished(self) -> float:
        return self.arrivals[-1][0] if self.arrivals else self.started

    def inter_token(self) -> list[float]:
        """Gap between arrivals spread over the tokens of the later one (an arrival may carry several)."""
        gaps: list[float] = []
        for (before, _), (after, count) in zip(self.arrivals, self.arrivals[1:], strict=False):
            gaps.extend([(after - before) / count] * count)
        return gaps


@dataclass(frozen=True)
class PhaseSummary:
    """One concurrency level of one side (in-process or full path)."""

    concurrency: int
    streams: int
    tokens: int
    seconds: float
    ttft_p50: float
    ttft_p99: float
    itl_p50: float
    itl_p99: float
    client_cpu_percent: float

    @property
    def tokens_per_second(self) -> float:
        return self.tokens / self.seconds if self.seconds else math.nan


def summarize(
    concurrency: int, timings: Sequence[StreamTiming], seconds: float, client_cpu_percent: float
) -> PhaseSummary:
    ttfts = [t.ttft for t in timings]
    itls = [gap for t in timings for gap in t.inter_token()]
    return PhaseSummary(
        concurrency=concurrency,
        streams=len(timings),
        tokens=sum(t.tokens for t in timings),
        seconds=seconds,
        ttft_p50=percentile(ttfts, 50),
        ttft_p99=percentile(ttfts, 99),
        itl_p50=percentile(itls, 50),
        itl_p99=percentile(itls, 99),
        client_cpu_percent=client_cpu_percent,
    )
