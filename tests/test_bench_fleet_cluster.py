"""The fleet harness's parts for the streams on a Redis Cluster (bench/redis_cluster.py's slot layout,
bench/fleet_figures.py's masters' figures, bench/fleet_cluster_report.py, bench/capacity_model.py's
sizing by masters and the control plane's limit): pure, no Redis."""

from __future__ import annotations

import itertools
import json
import math
from dataclasses import replace
from pathlib import Path

import pytest
from redis.crc import REDIS_CLUSTER_HASH_SLOTS

from bench.capacity_model import (
    Workload,
    control_cores,
    jobs_per_control_core,
    workers_per_cluster,
    workers_per_control_plane,
)
from bench.fleet import QUICK, main_parser, plan_of
from bench.fleet_cluster_report import HEADING, against_one_master, partitions_held, section
from bench.fleet_figures import FleetLevel, FleetRun, Lifecycle
from bench.fleet_report import HEADING as FLEET_HEADING
from bench.redis_cluster import partition_slots, slot_ranges
from bench.report import load, record
from shared.keys import Keys
from tests.test_bench_fleet import level, window


def test_the_masters_slot_ranges_cover_every_slot_and_share_the_partitions_evenly() -> None:
    slots = partition_slots(Keys("any", 16))
    for masters in (1, 2, 3, 5, 16):
        ranges = slot_ranges(masters, slots)
        assert ranges[0][0] == 0 and ranges[-1][1] == REDIS_CLUSTER_HASH_SLOTS - 1
        assert all(last + 1 == first for (_, last), (first, _) in itertools.pairwise(ranges))
        held = [sum(first <= slot <= last for slot in slots) for first, last in ranges]
        assert sum(held) == 16 and max(held) - min(held) <= 1


def test_a_partitions_slot_is_its_hash_tags_whatever_the_prefix() -> None:
    assert partition_slots(Keys("a", 16)) == partition_slots(Keys("b", 16))
    assert len(set(partition_slots(Keys("a", 16)))) == 16


def test_more_masters_than_partitions_is_refused() -> None:
    with pytest.raises(ValueError):
        slot_ranges(17, partition_slots(Keys("any", 16)))


def clustered(masters: int, master_cpu: tuple[float, ...], streams: int = 1000) -> FleetLevel:
    """A level of `level()`'s, its 7,000 followed events' Redis CPU `master_cpu` over its masters."""
    base = level()
    followed = replace(base.followed, redis_cpu=sum(master_cpu), master_cpu=master_cpu, control_cpu=0.014)
    return replace(
        base,
        streams=streams,
        followed=followed,
        masters=masters,
        lifecycle=Lifecycle(jobs=1000, start_cpu=0.1, start_seconds=4.0, end_cpu=0.05, end_seconds=1.0),
    )


def test_the_masters_figures_are_each_ones_cpu_per_event_of_them_all_and_the_busiest_over_the_mean() -> None:
    figures = clustered(3, (0.07, 0.056, 0.084))
    assert figures.redis_total_us == pytest.approx(30.0)
    assert figures.master_us == pytest.approx((10.0, 8.0, 12.0))
    assert figures.busiest_share == pytest.approx(1.2)  # 0.084 over the mean 0.07
    assert figures.control_us == pytest.approx(2.0)
    assert math.isnan(replace(figures, followed=window(0, 0.0)).busiest_share)


def test_the_control_planes_cost_a_job_is_its_cpu_while_started_and_while_ended() -> None:
    lifecycle = Lifecycle(jobs=1000, start_cpu=0.1, start_seconds=4.0, end_cpu=0.05, end_seconds=1.0)
    assert lifecycle.us_per_job == pytest.approx(150.0)
    assert lifecycle.jobs_per_second(0.7) == pytest.approx(0.7 / 150e-6)


def run_of(*levels: FleetLevel) -> FleetRun:
    plan = replace(QUICK, masters=(1, 3), clients="sse")
    return FleetRun("python -m bench.fleet --masters 1 3", "today", plan, 0.002, [], list(levels))


def test_a_levels_cost_is_set_against_the_same_level_on_one_master() -> None:
    one, three = clustered(1, (0.21,)), clustered(3, (0.08, 0.07, 0.09))
    run = run_of(one, three, clustered(3, (0.1,) * 3, streams=250))
    assert against_one_master(run, three) == pytest.approx(0.24 / 0.21)
    assert math.isnan(against_one_master(run, run.levels[-1]))  # no 250-stream level on one master


def test_the_section_says_each_target_met_or_missed_and_has_a_row_per_level() -> None:
    run = run_of(clustered(1, (0.21,)), clustered(3, (0.08, 0.07, 0.09)), clustered(3, (0.07, 0.07, 0.13)))
    text = section(run)
    assert text[0] == HEADING
    targets = [
        line for line in text if line.startswith("| 3 | 1000 |") and line.endswith(("met |", "missed |"))
    ]
    assert targets == ["| 3 | 1000 | 1.14: met | 1.12: met |", "| 3 | 1000 | 1.29: missed | 1.44: missed |"]
    costs = [line for line in text if line.startswith("| 3 | 5 / 6 / 5 | 1000 |")]
    assert costs[0].startswith("| 3 | 5 / 6 / 5 | 1000 | 4,000 / 3,500 | 34.3 / 10.0 / 24.3 | 1.14 |")
    assert "| 11.4 / 10.0 / 12.9 | 1.12 | 2.0 |" in costs[0]
    assert "| 1 | 1000 | 4.0, 100.0 | 1.0, 50.0 | 150.0 | 4,667 | 2.0 |" in text
    assert any("4,667 jobs started and ended a second" in line for line in text)


def test_the_sizing_rows_carry_the_workers_by_the_busiest_master_and_by_the_control_plane() -> None:
    """7,680 events/s at 34.3 µs summed is 0.263 of a core; on 3 masters, the busiest at 1.125 its
    share, 0.0987 of its core a worker: 7 workers in 70 %. The control plane: 15.36 jobs/s at 150 µs
    and 7,680 events/s at 2 µs, 0.0177 of its core a worker: 39 workers."""
    run = run_of(clustered(1, (0.21,)), clustered(3, (0.08, 0.07, 0.09)))
    text = section(run)
    rows = [line for line in text if line.startswith("| 3 | 256 jobs x 30 tokens/s |")]
    assert rows == ["| 3 | 256 jobs x 30 tokens/s | 7,680 | 34.3 | 1.12 | 7 | 15.4 | 0.0177 | 39 |"]


def test_sizing_by_masters_divides_the_load_by_the_masters_times_the_busiest_share() -> None:
    workload = Workload(jobs=256, tokens_per_second=30)
    assert workload.jobs_per_second == pytest.approx(15.36)  # 256 slots, a job of 500 tokens each
    assert workers_per_cluster(30e-6, 1.0, 1, workload, 0.7) == 3  # 0.2304 of a core a worker
    assert workers_per_cluster(30e-6, 1.0, 3, workload, 0.7) == 9
    assert workers_per_cluster(30e-6, 1.2, 3, workload, 0.7) == 7  # 0.0922 of the busiest's core
    assert jobs_per_control_core(200e-6, 0.7) == pytest.approx(3500)
    assert control_cores(200e-6, 1e-6, workload, 2) == pytest.approx(2 * (15.36 * 200e-6 + 7680e-6))
    assert workers_per_control_plane(200e-6, 1e-6, workload, 0.7) == 65  # 0.7 / 0.010752


def test_masters_are_a_flag_of_the_plan() -> None:
    plan = plan_of(main_parser().parse_args(["--quick", "--masters", "1", "2", "3"]))
    assert plan.masters == (1, 2, 3) and plan_of(main_parser().parse_args(["--quick"])).masters == ()
    assert partitions_held(plan, 2) == [8, 8]


def test_a_clustered_run_records_its_own_part_and_renders_its_section_after_the_fleets(
    tmp_path: Path,
) -> None:
    kept = run_of(clustered(1, (0.21,)))
    record(tmp_path, fleet=replace(kept, plan=QUICK))
    run = run_of(clustered(1, (0.21,)), clustered(3, (0.08, 0.07, 0.09)))
    record(tmp_path, fleet_cluster=run)
    record(tmp_path, fleet_cluster=run)
    lines = (tmp_path / "RESULTS.md").read_text().splitlines()
    assert lines.count(HEADING) == 1
    assert lines.index(FLEET_HEADING) < lines.index(HEADING) < lines.index("## Notes")
    assert load(tmp_path).fleet == replace(kept, plan=QUICK) and load(tmp_path).fleet_cluster == run
    assert json.loads((tmp_path / "results.json").read_text())["fleet_cluster"]["levels"][1]["masters"] == 3
    assert partitions_held(run.plan, 3) == [5, 6, 5]
