"""The section of bench/RESULTS.md of a fleet run with the streams on a Redis Cluster
(`python -m bench.fleet --masters ...`): each level's cost summed over the masters and against one
master's, how evenly the masters share it, the control plane's own cost, and what they mean for sizing."""

from __future__ import annotations

import math

from bench import fleet_report
from bench.capacity_model import (
    TYPICAL,
    UTILIZATION,
    control_cores,
    jobs_per_control_core,
    workers_per_cluster,
    workers_per_control_plane,
)
from bench.fleet_figures import FleetLevel, FleetPlan, FleetRun
from bench.formats import ratio, us
from bench.redis_cluster import partition_slots, slot_ranges
from shared.config import Settings
from shared.keys import Keys

HEADING = "## 9b. The data plane on a Redis Cluster's masters (synthetic engine)"
TARGET = 1.2  # the masters' summed cost against one master's, and the busiest master against its share


def partitions(plan: FleetPlan) -> int:
    default = Settings.model_fields["stream_partitions"].default
    return plan.stream_partitions if plan.stream_partitions is not None else int(default)


def partitions_held(plan: FleetPlan, masters: int) -> list[int]:
    """How many of the partitions each master holds, the slots placed as `redis_cluster` places them."""
    slots = partition_slots(Keys("", partitions(plan)))
    return [sum(first <= slot <= last for slot in slots) for first, last in slot_ranges(masters, slots)]


def against_one_master(run: FleetRun, level: FleetLevel) -> float:
    """The level's Redis CPU per event, summed over its masters, over the same level's on one master."""
    one = next(
        (
            other
            for other in run.levels
            if other.masters == 1 and (other.streams, other.asked_rate) == (level.streams, level.asked_rate)
        ),
        None,
    )
    return level.redis_total_us / one.redis_total_us if one else math.nan


def _cost_rows(run: FleetRun) -> list[str]:
    lines = [
        "| masters | partitions a master | streams | events/s asked / made"
        " | Redis µs/event summed over the masters: all / steps / relay | × one master's"
        " | each master's µs/event | busiest master / its even share | control plane µs/event"
        " | gateway µs/event | worker µs/event | machine busy |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for level in run.levels:
        held = " / ".join(map(str, partitions_held(run.plan, level.masters)))
        lines.append(
            f"| {level.masters} | {held} | {level.streams} | {level.asked_rate:,.0f} /"
            f" {level.followed.events_per_second:,.0f} | {us(level.redis_total_us)} /"
            f" {us(level.redis_step_us)} / {us(level.redis_relay_us)}"
            f" | {ratio(against_one_master(run, level))} | {' / '.join(map(us, level.master_us))}"
            f" | {ratio(level.busiest_share)} | {us(level.control_us)} | {us(level.gateway_us)}"
            f" | {us(level.worker_us)} | {level.followed.machine_busy:.0%} |"
        )
    return lines


def _delivery_rows(run: FleetRun) -> list[str]:
    lines = [
        "| masters | streams | lag p50 / p99 / p99.9, ms | sent | delivered | duplicated | reordered"
        " | failed follows | sustained |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for level in run.levels:
        d = level.delivery
        lines.append(
            f"| {level.masters} | {level.streams} | {fleet_report.lags_text(level)} | {d.sent}"
            f" | {d.delivered} | {d.duplicated} | {d.reordered} | {len(level.failures)}"
            f" | {'yes' if level.sustained else 'no'} |"
        )
    return lines


def _verdict(value: float) -> str:
    return "n/a" if math.isnan(value) else f"{value:.2f}: {'met' if value <= TARGET else 'missed'}"


def _target_rows(run: FleetRun) -> list[str]:
    lines = [
        f"| masters | streams | Redis µs/event summed over the masters, × one master's (target ≤ {TARGET:g})"
        f" | busiest master / its even share (target ≤ {TARGET:g}) |",
        "| --- | --- | --- | --- |",
    ]
    for level in run.levels:
        if level.masters > 1:
            lines.append(
                f"| {level.masters} | {level.streams} | {_verdict(against_one_master(run, level))}"
                f" | {_verdict(level.busiest_share)} |"
            )
    return lines


def _control_rows(run: FleetRun) -> list[str]:
    lines = [
        "| masters | jobs | submitted and started: s, µs a job | cancelled and ended: s, µs a job"
        f" | µs a job started and ended | jobs/s a control-plane core carries at {100 * UTILIZATION:.0f} %"
        " | control plane µs/event while they run |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for level in run.levels:
        life = level.lifecycle
        if life is None:
            continue
        lines.append(
            f"| {level.masters} | {life.jobs}"
            f" | {life.start_seconds:.1f}, {us(1e6 * life.start_cpu / life.jobs)}"
            f" | {life.end_seconds:.1f}, {us(1e6 * life.end_cpu / life.jobs)} | {us(life.us_per_job)}"
            f" | {life.jobs_per_second(UTILIZATION):,.0f} | {us(level.control_us)} |"
        )
    return lines


def _sizing_rows(run: FleetRun) -> list[str]:
    """Per master count, at its level with the most streams: the GPU workers the masters carry with the
    busiest at 70 %, and the control plane's share of them (`capacity_model`)."""
    lines = [
        "| masters | GPU worker | events/s a worker | Redis µs/event summed | busiest / even share"
        f" | workers the masters carry at {100 * UTILIZATION:.0f} % | jobs/s a worker"
        " | control-plane core a worker | workers the control plane carries |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    by_masters: dict[int, FleetLevel] = {}
    for level in run.levels:
        if level.masters not in by_masters or level.streams > by_masters[level.masters].streams:
            by_masters[level.masters] = level
    for masters, level in sorted(by_masters.items()):
        life = level.lifecycle
        per_job = life.us_per_job / 1e6 if life else math.nan
        per_event = level.control_us / 1e6
        redis_known = not math.isnan(level.redis_total_us + level.busiest_share)
        control_known = not math.isnan(per_job + per_event)
        for workload in TYPICAL:
            workers = (
                workers_per_cluster(
                    level.redis_total_us / 1e6, level.busiest_share, masters, workload, UTILIZATION
                )
                if redis_known
                else "n/a"
            )
            control = control_cores(per_job, per_event, workload, 1)
            carried = (
                workers_per_control_plane(per_job, per_event, workload, UTILIZATION)
                if control_known
                else "n/a"
            )
            lines.append(
                f"| {masters} | {workload.jobs} jobs x {workload.tokens_per_second:g} tokens/s"
                f" | {workload.events_per_second:,.0f} | {us(level.redis_total_us)}"
                f" | {ratio(level.busiest_share)} | {workers} | {workload.jobs_per_second:.1f}"
                f" | {control:.4f} | {carried} |"
            )
    return lines


def _limit(run: FleetRun) -> str:
    """The control plane's own limit, at the dearest lifecycle measured."""
    costs = [level.lifecycle.us_per_job for level in run.levels if level.lifecycle is not None]
    if not costs:
        return ""
    dearest = max(costs)
    return (
        f" The control plane's own limit, at the dearest of its costs a job ({us(dearest)} µs):"
        f" {jobs_per_control_core(dearest / 1e6, UTILIZATION):,.0f} jobs started and ended a second per"
        f" control-plane core at {100 * UTILIZATION:.0f} %, whatever the masters of the streams."
    )


def section(run: FleetRun) -> list[str]:
    """The section, from a run of `python -m bench.fleet --masters ...`."""
    plan = run.plan
    workload = TYPICAL[0]
    return [
        HEADING,
        "",
        f"Measured by `{run.command}` ({run.measured}, {run.minutes:.1f} minutes): the levels of section"
        f" 9's harness ({plan.workers} workers on the synthetic engine, {fleet_report.gateways_text(plan)}, a"
        f" client for every job in {plan.client_processes} processes: {fleet_report.clients_text(plan)}), run"
        f" once per count of masters ({', '.join(map(str, plan.masters))}), the job streams (the data"
        f" plane) on a private Redis Cluster of as many masters, started anew for each, the"
        " control plane (records, queues, leases) on a private Redis of its own. No replicas: a"
        " replica is availability, not capacity (it serves none of the streams' commands, and what"
        " its master spends feeding it goes with the events, not with the masters). The"
        f" {partitions(plan)} partitions' slots are placed so that each master holds an even share of"
        " them (`bench/redis_cluster.py`: `redis-cli --cluster create` makes no cluster of fewer than"
        " 3 masters), and each job's partition is its id's hash. Every server's CPU is its own (INFO"
        " cpu) less what it spends"
        f" idle (about {1e6 * run.idle_redis_cpu_per_second:.0f} µs/s each). Redis µs/event is the"
        " masters' CPU added up over their events (XADDs) added up, measured nobody following (steps)"
        f" for {plan.unfollowed_seconds:g} s, then every stream followed (all) for {plan.seconds:g} s;"
        " × one master's: over the same level's on one master, in the same run; busiest / even share:"
        " the busiest master's CPU over the masters' mean, with every stream followed. Control plane"
        " µs/event: its CPU over the same followed window (the running jobs' leases, the workers'"
        " heartbeats). The control plane's cost a job: its CPU while the level's jobs are submitted"
        " and claimed (a worker's share at a time, the harness polling their records until all run,"
        " the jobs already running renewing their leases meanwhile), and from their cancel until every"
        " client has its job's end.",
        "",
        "Targets:",
        "",
        *_target_rows(run),
        "",
        "Costs per event:",
        "",
        *_cost_rows(run),
        "",
        "Delivery (every delta of the level, each client's against its job's stream; lag for the events"
        " sent in the followed window):",
        "",
        *_delivery_rows(run),
        "",
        "The control plane, per job:",
        "",
        *_control_rows(run),
        "",
        "What it means for sizing (`bench/capacity_model.py`: `workers_per_cluster`,"
        " `workers_per_control_plane`), at each master count's level with the most streams: every job's"
        f" stream followed, the busiest master and the control plane kept at {100 * UTILIZATION:.0f} % of"
        " a core, a Llama-3-8B class model on one GPU, `stream_step` 1, each job"
        f" {workload.tokens_per_job} tokens (as one ends another starts).{_limit(run)}",
        "",
        *_sizing_rows(run),
        "",
        *([f"The run stopped early: {run.stopped}.", ""] if run.stopped else []),
    ]
