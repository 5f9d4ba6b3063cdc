"""Section 8 of bench/RESULTS.md and its target: jobs started per second with tenants against the single
queue, pickup, and the claim script's own cost."""

from __future__ import annotations

import math

from bench.fair_share_figures import FairShare
from bench.formats import ms, verdict
from bench.stats import percentile

TARGET = 0.90
"""Jobs started per second with tenants, at least this share of the single queue's (issue 21)."""
HEADING = "## 8. Fair sharing among tenants"
TARGET_LABEL = f"jobs started/s with tenants / single queue >= {TARGET:.2f} at 1, 10, 100 tenants (section 8)"


def target(fair: FairShare | None) -> str:
    if fair is None:
        return f"| {TARGET_LABEL} | not run | **missed** |"
    ratios = fair.ratios()
    text = ", ".join(f"{count}: {ratio:.3f}" for count, ratio in ratios.items())
    met = all(ratio >= TARGET for ratio in ratios.values())
    return f"| {TARGET_LABEL} | {text} | {verdict(met)} |"


def section(fair: FairShare) -> list[str]:
    """Section 8, from a run of `make bench` or of `python -m bench.fair_share` alone."""
    plan, ratios = fair.plan, fair.ratios()
    lines = [
        HEADING,
        "",
        f"Measured by `{fair.command}` ({fair.measured}), one worker (max_jobs {fair.max_jobs}). Tiny jobs"
        " (max_tokens 1, `workload.request`) submitted by `JobStore.submit` round-robin over the tenants"
        " (weight 1 each); with no tenant every job waits in the default share: the single queue of a"
        f" deployment without tenants. Burst: {plan.burst_jobs} jobs submitted while the worker's process"
        " is held (SIGSTOP), so that all of them wait in the queue when it resumes; jobs started per second"
        " are (N - 1) over the span of their `started_at`. Each figure is the median of"
        f" {plan.rounds} round(s) (each round's in brackets); a round runs every row once, each round"
        " beginning with the next row, after one warm-up burst. The first claim: the jobs the worker's"
        f" first claim takes as it resumes (up to {fair.max_jobs}), which start without waiting for the"
        " engine to end any; the rest start as jobs end. Pickup: "
        f"{plan.pickup_jobs} jobs one at a time, one every 20 ms, `created_at` to `started_at`, on an idle"
        " system (one job waits at a time: only its tenant's share has one).",
        "",
        "| tenants | jobs started/s (rounds) | ratio to no tenant | first claim's jobs started/s (rounds) "
        "| ratio | pickup p50, ms | pickup p99, ms | pickup max, ms |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    single = fair.single_queue.first_claim_per_second
    for run in fair.runs:
        rounds = " / ".join(f"{rate:.0f}" for rate in run.burst_rates)
        first = " / ".join(f"{rate:.0f}" for rate in run.first_rates)
        ratio = f"{ratios[run.tenants]:.3f}" if run.tenants in ratios else "1"
        lines.append(
            f"| {run.label} | {run.jobs_per_second:.0f} ({rounds}) | {ratio} "
            f"| {run.first_claim_per_second:.0f} ({first}) | {run.first_claim_per_second / single:.3f} "
            f"| {ms(percentile(run.pickup, 50))} | {ms(percentile(run.pickup, 99))} "
            f"| {ms(max(run.pickup, default=math.nan))} |"
        )
    lines += [
        "",
        f"The claim script alone, without the engine, on the same Redis: {plan.claims} jobs queued across"
        " the tenants (by `JobStore.submit`, for a model no worker serves), then claimed one per call"
        f" (`wanted` 1, `read_limit` {fair.read_limit} as the worker passes it), each claimed job then"
        " taken off the queue as the start script takes it. Before fair sharing: `bench/fifo_claim.lua`,"
        " the claim script as it was (the due jobs read from the queue's head, up to `read_limit`, in"
        " submission order), on copies of the same queue: with the worker's `read_limit`, and with 1 (the"
        " head alone: the least a FIFO claim can read). Time per call as Redis counts it (INFO"
        " commandstats, EVALSHA: the script's own run; the idle worker's few calls in the same seconds"
        " count too), and the client's round trip.",
        "",
        f"| jobs queued across | claims | µs/claim before, read_limit {fair.read_limit} "
        "| µs/claim before, read_limit 1 | µs/claim fair sharing | fair / before (read_limit 1) "
        "| round trip p50 before / before (1) / fair, µs |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for cost in fair.claims:
        fair_us = cost.fair.us
        lines.append(
            f"| {cost.label} | {cost.claims} | {cost.fifo.us:.1f} | {cost.fifo_head.us:.1f} "
            f"| {fair_us:.1f} | {fair_us / cost.fifo.us:.2f} ({fair_us / cost.fifo_head.us:.2f}) "
            f"| {cost.fifo.round_trip_us:.0f} / {cost.fifo_head.round_trip_us:.0f} "
            f"/ {cost.fair.round_trip_us:.0f} |"
        )
    return [*lines, ""]
