"""The physical limits a fleet run measures beside its levels (pure, no I/O): what Redis, a socket write
and the gateway's HTTP server cost when each does nothing else, the floors under the levels' figures."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Limit:
    """A physical limit: `redis-benchmark` sending one command as fast as Redis takes it, and Redis's own
    CPU per command there (idle share taken off)."""

    name: str
    pipeline: int
    requests: int
    per_second: float
    redis_cpu: float

    @property
    def redis_us(self) -> float:
        return 1e6 * self.redis_cpu / self.requests


@dataclass(frozen=True)
class WriteCost:
    """One event's write to a client's socket, by a process that does nothing else (`bench.socket_limit`)."""

    connections: int
    chunk_bytes: int
    writes: int
    cpu_us_per_write: float


@dataclass(frozen=True)
class RequestCost:
    """One long-poll's request to the gateway's HTTP server, answered at once (`bench.request_limit`)."""

    connections: int
    requests_per_second: float
    page_bytes: int
    requests: int  # in the measured window: the rate's worth of its seconds, counted by the server
    cpu_us_per_request: float
    answered: int  # every request the client had answered, the window's and those around it
    sent: int | None  # every request the client sent (`answered` when the server answered them all);
    # None in a run from before it was counted
