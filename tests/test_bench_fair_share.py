"""The fair-sharing phase of the benchmark (bench/fair_share.py): its rates and ratios, section 8 and its
target in RESULTS.md, the in-place update a run of the phase alone makes, and the claim-cost run on the
real Redis."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from bench.fair_share import FIFO_CLAIM, QUICK, claim_cost, submitter
from bench.fair_share_figures import ClaimCost, FairShare, TenantRun, Timing, started_per_second
from bench.fair_share_report import HEADING as FAIR_SHARE_HEADING
from bench.report import record, render
from bench.results_figures import Results
from shared.jobstore import JobStore


def measured(rates: dict[int, list[float]]) -> FairShare:
    """A phase's figures: `rates` are each tenant count's rounds (0: the single queue)."""
    fair = FairShare("python -m bench.fair_share", "2026-01-01 00:00 UTC", QUICK, 1280, 256)
    fair.runs = [
        TenantRun(count, list(rounds), list(rounds), [0.001, 0.002]) for count, rounds in rates.items()
    ]
    fair.claims = [ClaimCost(count, 300, Timing(60, 100), Timing(8, 46), Timing(20, 64)) for count in rates]
    return fair


def target(lines: list[str]) -> str:
    (row,) = [line for line in lines if line.startswith("| jobs started/s with tenants")]
    return row


def test_jobs_started_per_second_are_n_minus_one_over_the_span_of_start_times() -> None:
    assert started_per_second([3.0, 1.0, 2.0, 1.5]) == pytest.approx(1.5)


def test_a_burst_gives_the_rate_of_all_its_jobs_and_of_those_of_the_first_claim() -> None:
    run = TenantRun(10)
    run.add_burst([0.0, 0.1, 0.2, 2.2], first_claim=3)
    assert run.burst_rates == [pytest.approx(3 / 2.2)]
    assert run.first_rates == [pytest.approx(2 / 0.2)]


def test_each_tenant_count_is_compared_with_the_single_queue_on_the_median_of_its_rounds() -> None:
    fair = measured({0: [100, 80, 120], 1: [99, 300, 10], 10: [95, 95, 95], 100: [91, 200, 50]})
    assert fair.ratios() == pytest.approx({1: 0.99, 10: 0.95, 100: 0.91})


def results(fair: FairShare | None) -> Results:
    run = Results("make bench", "full", {}, 128)
    run.fair_share = fair
    return run


def test_the_target_is_met_at_nine_tenths_of_the_single_queue_at_every_count() -> None:
    text = render(results(measured({0: [100], 1: [99], 10: [95], 100: [90]})))
    assert target(text).endswith("| 1: 0.990, 10: 0.950, 100: 0.900 | **met** |")
    assert FAIR_SHARE_HEADING in text
    assert "| 100 tenants | 90 (90) | 0.900 | 90 (90) | 0.900 | 1.0 | 2.0 | 2.0 |" in text


def test_the_target_is_missed_below_nine_tenths_at_any_count_or_when_not_run() -> None:
    text = render(results(measured({0: [100], 1: [99], 10: [89], 100: [95]})))
    assert target(text).endswith("**missed** |")
    assert target(render(results(None))).endswith("| not run | **missed** |")


def test_a_run_alone_records_its_part_keeps_the_others_and_renders_section_8_again(tmp_path: Path) -> None:
    record(tmp_path, pickup=[0.001], cancels=[])
    record(tmp_path, fair_share=measured({0: [100], 1: [99], 10: [95], 100: [90]}))
    text = (tmp_path / "RESULTS.md").read_text()
    assert text.index("## 3. Queue pickup") < text.index(FAIR_SHARE_HEADING) < text.index("## Notes")
    assert "1 jobs of max_tokens 1" in text  # section 3, from the part kept
    raw = json.loads((tmp_path / "results.json").read_text())
    assert raw["pickup"] == [0.001] and raw["fair_share"]["runs"][3]["burst_rates"] == [90]

    record(tmp_path, fair_share=measured({0: [100], 1: [99], 10: [95], 100: [80]}))
    again = (tmp_path / "RESULTS.md").read_text()
    assert again.count(FAIR_SHARE_HEADING) == 1 and again.count("| jobs started/s with tenants") == 1
    assert "100: 0.800 | **missed** |" in again


async def test_the_script_before_fair_sharing_claims_from_the_queues_head(store: JobStore) -> None:
    model = store.keys.model("smol")
    submit, ids = submitter(store, "smol", 3), []
    for number in range(3):
        ids.append(await submit(number))
        await asyncio.sleep(0.002)  # each in a millisecond of its own: the queue's scores are ms
    marks = f"{store.keys.prefix}:in-progress:"
    answer = await FIFO_CLAIM(store.redis, [model.queue], [2**50, 60_000, marks, 100, 2])
    assert answer[::2] == ids[:2]
    assert (await FIFO_CLAIM(store.redis, [model.queue], [2**50, 60_000, marks, 100, 2]))[::2] == ids[2:]


async def test_claim_costs_time_every_claim_of_both_scripts_on_the_same_jobs(store: JobStore) -> None:
    cost = await claim_cost(store, 10, 30, 1280)
    assert cost.tenants == 10 and cost.claims == 30
    assert all(
        timing.us > 0 and timing.round_trip_us > 0 for timing in (cost.fifo, cost.fifo_head, cost.fair)
    )
    root = store.keys.model("fair-share-claims-10").root
    for queue in (f"{root}:queue", f"{root}:fifo-queue:1280", f"{root}:fifo-queue:1"):
        assert await store.redis.zcard(queue) == 0  # every job claimed once, then taken off the queue
