"""What one level of the fleet measured, as figures per unit of work (pure, no I/O): µs of CPU per
event, so that a figure holds on a machine of another size.

A level is measured in two windows of the same running jobs: first with no client following them
(Redis then spends its CPU on the workers' steps alone: the appends and the lease and cancel checks
of the step script), then with every job followed. Redis's CPU per event in the second, less the
first's, is the relay's share (the gateways' reads, and serving them their blocked reads).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field

from bench.delivery import Delivery
from bench.fleet_clients import MIXED
from bench.limit_figures import Limit, RequestCost, WriteCost
from bench.stats import percentile

LAG_TARGET_SECONDS = 0.020
STEP_COMMANDS = ("evalsha", "eval")
"""The workers' scripts: steps (and heartbeats' lease renewals); their XADDs count inside them too."""
RELAY_COMMANDS = ("xread", "xrange", "xrevrange")
QUANTILES = (50.0, 99.0, 99.9)
ALL = "all"
"""The lags of every kind of client together, beside each kind's (`fleet_clients.KINDS`)."""


def us_per(cpu_seconds: float, units: int) -> float:
    """µs of CPU per unit; NaN for no units, so that a missing figure shows as such."""
    return 1e6 * cpu_seconds / units if units else math.nan


@dataclass(frozen=True)
class Window:
    """One measuring window: events the workers appended (Redis's XADD calls, each one delta of one
    step), and the CPU seconds each kind of process spent meanwhile (Redis's less what it spends idle)."""

    seconds: float
    events: int
    redis_cpu: float
    gateway_cpu: float
    worker_cpu: float
    client_cpu: float
    machine_busy: float  # share of every core busy, whoever ran
    calls: dict[str, int] = field(default_factory=dict)
    usec: dict[str, int] = field(default_factory=dict)  # µs in each command, as Redis counts it
    gateway_system_cpu: float = 0.0  # the part of `gateway_cpu` spent in the kernel (socket writes)
    master_cpu: tuple[float, ...] = ()  # each master's of `redis_cpu`, the streams on a Redis Cluster
    control_cpu: float = 0.0  # the control plane's Redis (`redis_url`), when the streams are elsewhere

    @property
    def events_per_second(self) -> float:
        return self.events / self.seconds if self.seconds else math.nan

    def per_event(self, cpu_seconds: float) -> float:
        return us_per(cpu_seconds, self.events)

    def commands_per_event(self, names: Iterable[str]) -> float:
        """µs Redis counts in the commands `names`, per event."""
        return self.per_event(sum(self.usec.get(name, 0) for name in names) / 1e6)


@dataclass(frozen=True)
class Lags:
    """The lags of the events one kind of client received in a followed window, as percentiles (seconds):
    what results.json keeps of them. `events` is None in a run from before it was kept."""

    events: int | None
    p50: float
    p99: float
    p999: float

    def at(self, q: float) -> float:
        return {50.0: self.p50, 99.0: self.p99, 99.9: self.p999}[q]


def lags_of(seconds: list[float]) -> Lags:
    return Lags(len(seconds), *(percentile(seconds, q) for q in QUANTILES))


def lags_by_kind(by_kind: dict[str, list[float]]) -> dict[str, Lags]:
    """Each kind's lags, and all of them together (`ALL`)."""
    every = [lag for lags in by_kind.values() for lag in lags]
    return {**{kind: lags_of(lags) for kind, lags in by_kind.items()}, ALL: lags_of(every)}


@dataclass(frozen=True)
class Lifecycle:
    """The control plane's Redis CPU (idle share taken off) while a level's `jobs` were submitted and
    started (the workers' claims), and while they were cancelled and ended, with the seconds each took:
    the jobs' lifecycle, with the running jobs' lease renewals and the workers' heartbeats meanwhile."""

    jobs: int
    start_cpu: float
    start_seconds: float
    end_cpu: float
    end_seconds: float

    @property
    def us_per_job(self) -> float:
        """µs of the control plane's CPU per job started and ended."""
        return us_per(self.start_cpu + self.end_cpu, self.jobs)

    def jobs_per_second(self, utilization: float) -> float:
        """Jobs started and ended a second that keep one control-plane core `utilization` busy."""
        return 1e6 * utilization / self.us_per_job


@dataclass
class FleetLevel:
    """`streams` running jobs over `workers` workers, `steps_per_second` asked of each, every job
    followed by a client through one of `gateways` gateway processes."""

    streams: int
    workers: int
    gateways: int
    steps_per_second: float
    unfollowed: Window
    followed: Window
    delivery: Delivery
    lags: dict[str, Lags]  # by the clients' kind (fleet_clients.KINDS), and all of them (`ALL`)
    failures: list[str]
    masters: int = 0  # the streams' Redis Cluster's masters; 0: the streams on the one Redis
    lifecycle: Lifecycle | None = None  # with the streams on a cluster, the control plane's share
    stream_step: int = 1  # tokens an event (`FleetPlan.stream_step`)

    @property
    def asked_rate(self) -> float:
        """Events a second asked of the level (tokens a second over `stream_step`)."""
        return self.streams * self.steps_per_second / self.stream_step

    @property
    def achieved(self) -> float:
        """The events/s the workers made while followed, as a share of the rate asked: the synthetic
        engine waits its step time after each step's publishing, so a step takes a little longer."""
        return self.followed.events_per_second / self.asked_rate

    @property
    def redis_step_us(self) -> float:
        """Redis CPU per event of the workers' steps, nobody following."""
        return self.unfollowed.per_event(self.unfollowed.redis_cpu)

    @property
    def redis_total_us(self) -> float:
        """Redis CPU per relayed event, everything included."""
        return self.followed.per_event(self.followed.redis_cpu)

    @property
    def redis_relay_us(self) -> float:
        return self.redis_total_us - self.redis_step_us

    @property
    def master_us(self) -> tuple[float, ...]:
        """Each master's Redis CPU per relayed event (of all the masters' events)."""
        return tuple(self.followed.per_event(cpu) for cpu in self.followed.master_cpu)

    @property
    def busiest_share(self) -> float:
        """The busiest master's CPU over its even share of the masters' CPU (1: perfectly even)."""
        cpus = self.followed.master_cpu
        return max(cpus) * len(cpus) / sum(cpus) if cpus and sum(cpus) > 0 else math.nan

    @property
    def control_us(self) -> float:
        """The control plane's Redis CPU per relayed event: the running jobs' leases and heartbeats."""
        return self.followed.per_event(self.followed.control_cpu)

    @property
    def gateway_us(self) -> float:
        return self.followed.per_event(self.followed.gateway_cpu)

    @property
    def gateway_system_us(self) -> float:
        return self.followed.per_event(self.followed.gateway_system_cpu)

    @property
    def worker_us(self) -> float:
        return self.followed.per_event(self.followed.worker_cpu)

    @property
    def client_us(self) -> float:
        """The load generator's own share: what it takes from the cores the rest is measured on."""
        return self.followed.per_event(self.followed.client_cpu)

    def lag(self, q: float, kind: str = ALL) -> float:
        lags = self.lags.get(kind)
        return lags.at(q) if lags is not None else math.nan

    @property
    def sustained(self) -> bool:
        """Lag p99 within its target, and every event delivered once and in order."""
        return self.lag(99) <= LAG_TARGET_SECONDS and self.delivery.exact and not self.failures


@dataclass(frozen=True)
class FleetPlan:
    """What a run measures: `fleet.FULL`, `fleet.QUICK`, or either with some of it changed by flags."""

    workers: int
    gateways: int
    client_processes: int
    rate: float  # events a second in all, at each level of `streams`
    streams: tuple[int, ...]
    rate_streams: int  # the streams of the levels that raise the rate
    rate_factor: float
    rate_levels: int  # at most so many of them
    seconds: float  # the followed window
    unfollowed_seconds: float
    limit_requests: int  # sent by redis-benchmark for each physical limit
    gateway_processes: int = 1  # each gateway's processes on its one port (`streampool gateway --processes`)
    clients: str = (
        MIXED  # how the clients follow: the mix, or one kind for all (`fleet_clients.CLIENT_MIXES`)
    )
    masters: tuple[int, ...] = ()  # the streams on a Redis Cluster of each many masters in turn; (): on one
    stream_partitions: int | None = None  # the streams' partitions on a cluster; None: the setting's default
    stream_step: int = 1
    """Each job's `stream_step`, tokens an event: its steps run this many times faster than its events,
    at the same events a second (coalescing at the source, as vLLM's `stream_interval` does)."""


@dataclass
class FleetRun:
    """One run: its command, plan, the Redis limits beside it, and its levels in the order run."""

    command: str
    measured: str
    plan: FleetPlan
    idle_redis_cpu_per_second: float = 0.0
    limits: list[Limit] = field(default_factory=list)
    levels: list[FleetLevel] = field(default_factory=list)
    stopped: str | None = None  # why the run ended before its plan's last level
    minutes: float = 0.0
    write_cost: WriteCost | None = None  # one event's write to a client's socket, alone
    request_cost: RequestCost | None = None  # one long-poll's request to the gateway's server, alone
    step_limit: Limit | None = None  # the step script's cost a job-step on a busy Redis (`step_limit`)
