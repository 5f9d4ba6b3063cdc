"""The scheduling phase of the benchmark (bench/scheduling.py): its targets and section 11 in
RESULTS.md, and the claim-cost run on the real Redis (its workers are heartbeat entries: the subject
is the claim script)."""

from __future__ import annotations

import dataclasses

from bench.report import render
from bench.results_figures import Results
from bench.scheduling import claim_cost
from bench.scheduling_figures import QUICK, ClaimCost, Conversations, Scheduling, TokenShares
from bench.scheduling_report import HEADING, NO_AFFINITY, ONE_SERVER, PREFIX_AWARE
from shared.jobstore import JobStore


def measured(ttft_ours: float, hit_ours: float, usec_with: float, long_tokens: int) -> Scheduling:
    run = Scheduling(QUICK)
    run.conversations = [
        Conversations(PREFIX_AWARE, 96, ttft_ours, ttft_ours * 3, hit_ours, 60),
        Conversations(NO_AFFINITY, 96, 100, 300, 0.5, 80),
        Conversations(ONE_SERVER, 96, 50, 150, 0.9, 70),
    ]
    run.claims = ClaimCost(2000, 50, 8, 20.0, usec_with, True, 1.0)
    run.shares = [
        TokenShares("tokens", {"long": long_tokens, "short": 10_000}, {"long": 6, "short": 333}),
        TokenShares("jobs", {"long": 30_000, "short": 1_000}, {"long": 25, "short": 25}),
    ]
    return run


def targets(run: Scheduling) -> list[str]:
    lines = render(Results("make bench", "full", {}, 128, scheduling=run))
    assert HEADING in lines
    return [line for line in lines if "(section 11)" in line]


def test_the_targets_are_read_from_the_runs_beside_each_other() -> None:
    met = targets(measured(ttft_ours=50, hit_ours=0.85, usec_with=29.0, long_tokens=11_000))
    assert [row.rsplit("|", 2)[1].strip() for row in met] == ["**met**"] * 4
    assert "| 0.94 |" in met[0] and "| 0.50 |" in met[1] and "| 1.45 |" in met[2] and "| 1.10 |" in met[3]
    missed = targets(measured(ttft_ours=70, hit_ours=0.7, usec_with=31.0, long_tokens=12_000))
    assert [row.rsplit("|", 2)[1].strip() for row in missed] == ["**missed**"] * 4


def test_a_run_without_the_phase_says_it_was_not_run() -> None:
    lines = render(Results("make bench", "full", {}, 128))
    assert [line for line in lines if "(section 11)" in line and "| not run |" in line] != []
    assert lines[lines.index(HEADING) + 2] == "Not measured in this run."


async def test_every_job_is_claimed_once_and_by_the_worker_holding_its_prefix(store: JobStore) -> None:
    plan = dataclasses.replace(QUICK, claim_jobs=120, prefix_groups=12, workers=4)
    cost = await claim_cost(store, plan)
    assert cost.claimed_once and cost.jobs == 120
    assert cost.held_share == 1.0  # each worker found its own groups' jobs first
    assert cost.usec_with > 0 and cost.usec_without > 0
