"""The scheduling phase's figures (pure, no I/O): prefix-aware claiming on the real engine, the claim
script's cost with it, and fair shares counted in tokens (bench/scheduling.py measures them)."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class SchedulingPlan:
    conversations: int
    turns: int
    answer_tokens: int
    claim_jobs: int
    prefix_groups: int
    workers: int
    share_seconds: float


FULL = SchedulingPlan(
    conversations=16,
    turns=6,
    answer_tokens=48,
    claim_jobs=2000,
    prefix_groups=50,
    workers=8,
    share_seconds=60,
)
QUICK = SchedulingPlan(
    conversations=4, turns=3, answer_tokens=16, claim_jobs=300, prefix_groups=50, workers=8, share_seconds=15
)


@dataclass
class Conversations:
    """One deployment's run of the conversations."""

    label: str
    turns: int
    ttft_p50_ms: float
    ttft_p99_ms: float
    hit_rate: float  # vLLM's prefix-cache hits over its queries, in tokens
    seconds: float


@dataclass
class ClaimCost:
    jobs: int
    prefix_groups: int
    workers: int
    usec_without: float  # Redis's time in claim calls per job claimed, claim script without affinity
    usec_with: float  # and with it (calls that found nothing to take included)
    claimed_once: bool  # every job was claimed, none twice
    held_share: float  # of the jobs claimed with affinity, the share claimed by the worker holding its group


@dataclass
class TokenShares:
    unit: str  # what the share counted: "tokens" or "jobs"
    served: dict[str, int]  # weighted tokens served by tenant (prompt + 2 x output of ended jobs)
    jobs: dict[str, int]  # jobs ended by tenant

    @property
    def ratio(self) -> float:
        return self.served["long"] / max(1, self.served["short"])


@dataclass
class Scheduling:
    """The phase's three parts, each with the command that measured it and when (`measured_by`): a
    run of some parts alone keeps the others' figures."""

    plan: SchedulingPlan
    conversations: list[Conversations] = field(default_factory=list)
    claims: ClaimCost | None = None
    shares: list[TokenShares] = field(default_factory=list)
    measured_by: dict[str, str] = field(default_factory=dict)  # part -> "`command` (when)"

    def keeping(self, earlier: Scheduling | None) -> Scheduling:
        """These figures, with `earlier`'s for the parts this run did not measure."""
        if earlier is None:
            return self
        return Scheduling(
            self.plan,
            self.conversations or earlier.conversations,
            self.claims or earlier.claims,
            self.shares or earlier.shares,
            {**earlier.measured_by, **self.measured_by},
        )
