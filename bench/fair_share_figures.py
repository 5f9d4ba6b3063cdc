"""What the fair sharing phase measured (pure, no I/O): jobs started per second and pickup by the count of
tenants the jobs are queued over, and the claim script's own cost beside the script before fair sharing."""

from __future__ import annotations

from dataclasses import dataclass, field
from statistics import median

NO_TENANT = 0
"""The single queue: jobs of no tenant."""
TENANT_COUNTS = (NO_TENANT, 1, 10, 100)


@dataclass(frozen=True)
class FairPlan:
    """How much the phase runs."""

    burst_jobs: int  # jobs per burst
    rounds: int  # bursts per tenant count, interleaved: each round runs every count once
    pickup_jobs: int  # jobs one at a time, per tenant count
    claims: int  # jobs queued and claimed one per call, per tenant count and script


def label(tenants: int) -> str:
    """A tenant count as the report names it."""
    return "no tenant (single queue)" if tenants == NO_TENANT else f"{tenants} tenant{'s' * (tenants > 1)}"


@dataclass
class TenantRun:
    """One tenant count (NO_TENANT: the single queue) end to end."""

    tenants: int
    burst_rates: list[float] = field(default_factory=list)  # jobs started per second, one per round
    first_rates: list[float] = field(default_factory=list)  # the same, of the jobs of the first claim
    pickup: list[float] = field(default_factory=list)  # seconds, created_at to started_at

    def add_burst(self, started: list[float], first_claim: int) -> None:
        """One burst's start times: the rate of all its jobs, and of the `first_claim` started first
        (the jobs the worker's first claim took as it resumed, where the engine holds none back)."""
        self.burst_rates.append(started_per_second(started))
        self.first_rates.append(started_per_second(sorted(started)[:first_claim]))

    @property
    def label(self) -> str:
        return label(self.tenants)

    @property
    def jobs_per_second(self) -> float:
        """The median of the rounds: one burst's rate swings with the machine's other loads."""
        return median(self.burst_rates)

    @property
    def first_claim_per_second(self) -> float:
        return median(self.first_rates)


@dataclass(frozen=True)
class Timing:
    """One claim script's calls: Redis's own time per call (INFO commandstats) and the client's round trip
    per call (p50), in µs."""

    us: float
    round_trip_us: float


@dataclass(frozen=True)
class ClaimCost:
    """The claim script's cost with jobs queued across `tenants`, beside the script before fair sharing,
    with the worker's `read_limit` and reading the queue's head only (its cheapest)."""

    tenants: int
    claims: int
    fifo: Timing
    fifo_head: Timing
    fair: Timing

    @property
    def label(self) -> str:
        return label(self.tenants)


@dataclass
class FairShare:
    """Everything the phase measured."""

    command: str
    measured: str  # when (UTC): a run of this phase alone is not the run of the rest of RESULTS.md
    plan: FairPlan
    read_limit: int
    max_jobs: int  # the worker's: its first claim after a burst takes this many jobs
    runs: list[TenantRun] = field(default_factory=list)
    claims: list[ClaimCost] = field(default_factory=list)

    def run(self, tenants: int) -> TenantRun:
        return next(run for run in self.runs if run.tenants == tenants)

    @property
    def single_queue(self) -> TenantRun:
        return self.run(NO_TENANT)

    def ratios(self) -> dict[int, float]:
        """Jobs started per second with each count of tenants over the single queue's."""
        single = self.single_queue.jobs_per_second
        return {run.tenants: run.jobs_per_second / single for run in self.runs if run.tenants != NO_TENANT}


def started_per_second(started: list[float]) -> float:
    """Jobs started per second from their start times: (N - 1) over the span from the first to the last."""
    ordered = sorted(started)
    return (len(ordered) - 1) / (ordered[-1] - ordered[0])
