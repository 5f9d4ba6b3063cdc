"""bench/REDIS_CAPACITY.md from one `bench.redis_capacity` run: the measured costs, and what they mean
for GPU workers and gateways (`capacity_model`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from bench.capacity_model import RedisCosts, Workload, gateways_for, redis_cores, workers_per_redis

if TYPE_CHECKING:
    from bench.redis_capacity import Capacity, RelayCost, Saturation, StepCost

UTILIZATION = 0.7  # of Redis's core and of each gateway's, leaving room for bursts and everything else
TYPICAL = (Workload(32, 50.0), Workload(256, 30.0))
"""A Llama-3-8B class model on one GPU: 32 sequences at about 50 tokens/s each, or 256 at about 30."""


def _us(seconds: float) -> str:
    return f"{seconds * 1e6:.1f}"


def describe_steps(cost: StepCost) -> str:
    return (
        f"{cost.jobs} jobs x {cost.steps} steps at {cost.rate:g}/s: Redis CPU {_us(cost.per_step)} us "
        f"per step, {_us(cost.per_script)} us per script; "
        f"{cost.round_trips / cost.steps:.2f} round trips per step; "
        f"one core carries {1 / cost.per_step:,.0f} steps/s"
    )


def describe_saturation(saturation: Saturation) -> str:
    return (
        f"step calls of {saturation.jobs} jobs back to back: {saturation.job_steps_per_second:,.0f} "
        f"job-steps/s at Redis CPU {saturation.redis_cpu_percent:.0f} %, "
        f"{_us(saturation.per_job_step)} us per job-step"
    )


def describe_relay(cost: RelayCost) -> str:
    level = cost.level
    return (
        f"relay {level.streams} streams x {level.rate:g}/s in {cost.bursts_per_second:g} bursts/s: "
        f"Redis CPU {_us(cost.per_followed_stream)} us per "
        f"followed stream per second ({_us(cost.per_event)} us per event beyond its append of "
        f"{_us(cost.append_cpu_per_event)} us; {cost.reads / level.seconds:.0f} XREADs/s, "
        f"{_us(cost.per_stream_read)} us per stream read); gateway {_us(level.gateway_cpu_per_event)} us per "
        f"event; lag p99 {1000 * level.lag_p99:.1f} ms, {level.received}/{level.sent} delivered"
    )


def costs(capacity: Capacity, jobs: int, saturated: bool = False) -> RedisCosts:
    """The costs a sizing uses: the step cost at `jobs` (paced, or `saturated`: the calls sent back
    to back, per job-step times the jobs), and the highest relay cost measured."""
    if saturated:
        per_step = jobs * next(s.per_job_step for s in capacity.saturation if s.jobs == jobs)
    else:
        per_step = next(cost.per_step for cost in capacity.steps if cost.jobs == jobs)
    return RedisCosts(per_step, max(cost.per_followed_stream for cost in capacity.relay))


def gateway_cpu_per_event(capacity: Capacity) -> float:
    """The gateway's CPU per event at the busiest level (at lighter ones its fixed costs weigh more)."""
    busiest = max(capacity.relay, key=lambda cost: cost.level.sent)
    return busiest.level.gateway_cpu_per_event


def sizing_table(capacity: Capacity) -> list[str]:
    lines = [
        "| jobs per worker | tokens/s per job | steps/s per worker | events/s per worker "
        "| Redis core per worker | workers per Redis at 70 % (step cost at saturation) "
        "| followed streams | events/s relayed | gateways for them at 70 % |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for workload in TYPICAL:
        if not any(cost.jobs == workload.jobs for cost in capacity.steps) or not capacity.relay:
            continue
        measured = costs(capacity, workload.jobs)
        workers = workers_per_redis(measured, workload, UTILIZATION)
        at_saturation = workers_per_redis(
            costs(capacity, workload.jobs, saturated=True), workload, UTILIZATION
        )
        events = workers * workload.events_per_second
        gateways = gateways_for(events, gateway_cpu_per_event(capacity), UTILIZATION)
        lines.append(
            f"| {workload.jobs} | {workload.tokens_per_second:g} | {workload.steps_per_second:g} "
            f"| {workload.events_per_second:,.0f} | {100 * redis_cores(measured, workload, 1):.1f} % "
            f"| {workers} ({at_saturation}) | {workers * workload.jobs:,} | {events:,.0f} | {gateways} |"
        )
    return lines


def render(capacity: Capacity) -> list[str]:
    steps = [
        f"| {c.jobs} | {c.steps} at {c.rate:g}/s | {c.round_trips / c.steps:.2f} "
        f"| {c.calls.get('evalsha', 0) / c.steps:.1f} | {_us(c.per_step)} | {_us(c.per_script)} "
        f"| {1 / c.per_step:,.0f} | {c.jobs / c.per_step:,.0f} | {_us(c.lifecycle_cpu_seconds / c.jobs)} |"
        for c in capacity.steps
    ]
    saturation = [
        f"| {s.jobs} | {s.job_steps:,} | {s.job_steps_per_second:,.0f} | {s.redis_cpu_percent:.0f} "
        f"| {_us(s.per_job_step)} | {s.job_steps_per_second / s.jobs:,.0f} |"
        for s in capacity.saturation
    ]
    relay = [
        f"| {c.level.streams} x {c.level.rate:g}/s | {c.bursts_per_second:g} "
        f"| {c.level.sent:,} | {c.level.received:,} "
        f"| {1000 * c.level.lag_p99:.1f} | {c.reads / c.level.seconds:,.0f} | {_us(c.append_cpu_per_event)} "
        f"| {_us(c.per_event)} | {_us(c.per_stream_read)} | {_us(c.per_followed_stream)} "
        f"| {1 / c.per_followed_stream:,.0f} | {_us(c.level.gateway_cpu_per_event)} |"
        for c in capacity.relay
    ]
    return [
        "# The capacity of one Redis",
        "",
        f"Produced by `{capacity.command}`, one run; it starts no engine, and ran where none ran beside it.",
        "Every figure is Redis's own CPU time (INFO cpu, user + sys) for a fixed amount of work done at a",
        "steady pace well below saturation, less what the idle server spends in the same time "
        f"({_us(capacity.idle_cpu_per_second)} us a second here).",
        "One Redis core divided by a cost is a capacity; the machine's other load does not enter it.",
        "",
        "## Worker steps (the worker's own Publisher: one pipeline per step, one step script per job)",
        "",
        "| jobs per step | steps | round trips per step | EVALSHA per step | Redis CPU per step, us "
        "| per script, us | steps/s per core | scripts/s per core | submit + start + finish per job, us |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
        *steps,
        "",
        "Cross-check at saturation: the step calls of as many jobs (a delta each) made before and sent",
        "back to back in pipelines, as fast as Redis takes them (`bench.step_limit`).",
        "",
        "| jobs per call | job-steps | job-steps/s | Redis CPU % | per job-step, us | steps/s |",
        "| --- | --- | --- | --- | --- | --- |",
        *saturation,
        "",
        "## Relayed streams (synthetic producer, SSE clients through one gateway)",
        "",
        "The relay's cost is Redis's CPU with every stream followed less the same appends followed by",
        "nobody (the appends are in the step's cost already): the gateway's XREADs. The gateway's reader",
        "names every stream it follows in each blocking XREAD, so the cost goes with the streams followed",
        "times the reads a second more than with the events: the producer writes one burst every 10 ms,",
        "which the reader takes in about two reads. A gateway woken more often (steps of many workers",
        "arriving apart) reads more often, up to what its own CPU allows, and costs Redis in proportion.",
        "",
        "| streams x events/s | bursts/s | sent | delivered | lag p99, ms | gateway XREADs/s "
        "| append, us per event "
        "| relay, us per event | relay, us per stream per read | relay, us per followed stream per second "
        "| followed streams per core | gateway CPU per event, us |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
        *relay,
        "",
        "## What it means (capacity_model.py)",
        "",
        "Redis cores = workers x (steps/s x cost_per_step(jobs) + jobs x cost_per_followed_stream),",
        "with the step cost measured at the worker's jobs per step (paced, the higher of the two figures",
        "above) and the highest cost per followed stream measured; every job's stream followed;",
        f"Redis and each gateway kept at {100 * UTILIZATION:.0f} % of a core. A Llama-3-8B class model on",
        "one GPU, `stream_step` 1:",
        "",
        *sizing_table(capacity),
    ]
