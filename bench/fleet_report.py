"""Sections 4 and 9 of bench/RESULTS.md, section 4's targets, and the one line per level a fleet run
prints as it goes: the data plane measured by the fleet's harness (`bench.fleet`)."""

from __future__ import annotations

import math

from bench.capacity_model import TYPICAL, UTILIZATION, redis_cores_per_event
from bench.fleet_clients import KINDS, LONG_POLL, MIXED, RESUME, SSE
from bench.fleet_figures import (
    ALL,
    QUANTILES,
    RELAY_COMMANDS,
    STEP_COMMANDS,
    FleetLevel,
    FleetPlan,
    FleetRun,
)
from bench.formats import ms, us, verdict
from bench.socket_limit import ROUNDS_PER_SECOND

HEADING = "## 9. The data plane at a fleet's rates (synthetic engine)"
RELAY_HEADING = "## 4. Relay capacity, one gateway process (the fleet's harness, every client over SSE)"


def lags_text(level: FleetLevel, kind: str = ALL) -> str:
    return " / ".join(ms(level.lag(q, kind)) for q in QUANTILES)


def _events(level: FleetLevel, kind: str) -> str:
    """The events whose lag one kind of client measured."""
    lags = level.lags.get(kind)
    return "n/a" if lags is None or lags.events is None else str(lags.events)


def describe(level: FleetLevel) -> str:
    d = level.delivery
    return (
        f"{level.streams} streams x {level.steps_per_second:.3g} steps/s "
        f"({level.asked_rate:,.0f} events/s asked, {level.achieved:.0%} made): "
        f"Redis {us(level.redis_total_us)} us/event (steps "
        f"{us(level.redis_step_us)}, relay {us(level.redis_relay_us)}), gateway {us(level.gateway_us)}, "
        f"worker {us(level.worker_us)}; lag p50/p99/p99.9 {lags_text(level)} ms; sent {d.sent}, delivered "
        f"{d.delivered}, duplicated {d.duplicated}, reordered {d.reordered}, unexpected {d.unexpected}, "
        f"{len(level.failures)} failed follows; sustained: {'yes' if level.sustained else 'no'}"
    )


def _cost_rows(run: FleetRun) -> list[str]:
    lines = [
        "| streams | steps/s asked | events/s asked / made | Redis µs/event: all / steps / relay "
        "| Redis commandstats µs/event: scripts / reads | XREADs per event | gateway µs/event: all / kernel "
        "| worker µs/event | clients µs/event | machine busy |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for level in run.levels:
        followed = level.followed
        reads = followed.calls.get("xread", 0) / followed.events if followed.events else math.nan
        lines.append(
            f"| {level.streams} | {level.steps_per_second:.3g} | {level.asked_rate:,.0f} / "
            f"{followed.events_per_second:,.0f} | {us(level.redis_total_us)} / {us(level.redis_step_us)} / "
            f"{us(level.redis_relay_us)} | {us(followed.commands_per_event(STEP_COMMANDS))} / "
            f"{us(followed.commands_per_event(RELAY_COMMANDS))} | {reads:.2f} | {us(level.gateway_us)} / "
            f"{us(level.gateway_system_us)} | {us(level.worker_us)} | {us(level.client_us)} "
            f"| {followed.machine_busy:.0%} |"
        )
    return lines


def _delivery_rows(run: FleetRun) -> list[str]:
    lines = [
        "| streams | events/s asked | lag p50 / p99 / p99.9, ms | "
        + " | ".join(f"{kind}: events, lag p50 / p99 / p99.9 ms" for kind in KINDS)
        + " | sent | delivered | duplicated | reordered | failed follows | sustained |",
        "| --- | --- | --- | " + " | ".join("---" for _ in KINDS) + " | --- | --- | --- | --- | --- | --- |",
    ]
    for level in run.levels:
        d = level.delivery
        kinds = " | ".join(f"{_events(level, kind)}, {lags_text(level, kind)}" for kind in KINDS)
        lines.append(
            f"| {level.streams} | {level.asked_rate:,.0f} | {lags_text(level)} | {kinds} | {d.sent} "
            f"| {d.delivered} | {d.duplicated} | {d.reordered} | {len(level.failures)} "
            f"| {'yes' if level.sustained else 'no'} |"
        )
    return lines


def gateways_text(plan: FleetPlan) -> str:
    if plan.gateway_processes == 1:
        return f"{plan.gateways} gateway process{'es' * (plan.gateways > 1)}"
    return f"{plan.gateways} gateways of {plan.gateway_processes} processes each on its port (`--processes`)"


CLIENTS_ALONE = {
    SSE: "every one follows over SSE",
    LONG_POLL: "every one long-polls, waiting at the tip",
    RESUME: "every one drops its SSE connection after its first delta and resumes with `Last-Event-ID`",
}


def clients_text(plan: FleetPlan) -> str:
    """How the run's clients follow their jobs (`--clients`)."""
    if plan.clients == MIXED:
        return (
            "one in ten long-polls, one in ten drops its SSE connection after its first delta and resumes"
            " with `Last-Event-ID`, the rest follow over SSE"
        )
    return CLIENTS_ALONE[plan.clients] + f" (`--clients {plan.clients}`)"


def _sizing_rows(run: FleetRun) -> list[str]:
    """What the costs at the level with the most streams followed mean for GPU workers, by the capacity
    model (`capacity_model.redis_cores_per_event`); none when no level ran."""
    fixed = [level for level in run.levels if level.asked_rate == run.plan.rate] or run.levels
    if not fixed:
        return []
    level = max(fixed, key=lambda level: level.streams)
    rows = [
        "| GPU worker | events/s a worker | Redis µs/event | Redis core a worker"
        f" | workers a Redis core carries at {100 * UTILIZATION:.0f} % | gateway µs/event"
        " | gateway processes a worker |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    costs = [(f"{us(level.redis_total_us)} (the level's)", level.redis_total_us)]
    if run.step_limit is not None:
        busy = run.step_limit.redis_us + level.redis_relay_us
        costs.append((f"{us(busy)} (busy step {us(run.step_limit.redis_us)} + the level's relay)", busy))
    for workload in TYPICAL:
        gateways = workload.events_per_second * level.gateway_us / 1e6 / UTILIZATION
        for label, redis_us in costs:
            share = redis_cores_per_event(redis_us / 1e6, workload, 1)
            rows.append(
                f"| {workload.jobs} jobs x {workload.tokens_per_second:g} tokens/s"
                f" | {workload.events_per_second:,.0f} | {label} | {share:.3f}"
                f" | {math.floor(UTILIZATION / share)}"
                f" | {us(level.gateway_us)} | {gateways:.1f} |"
            )
    return [
        f"What it means for sizing (`bench/capacity_model.py`), at the costs of the {level.streams}-stream"
        " level: every job's stream followed, Redis and each gateway process kept at"
        f" {100 * UTILIZATION:.0f} % of a core, a Llama-3-8B class model on one GPU, `stream_step` 1."
        " Each worker twice: at the Redis cost the level measured, on a Redis mostly idle between its"
        " calls, and at the step's cost on a busy Redis (`bench.step_limit`) plus the level's relay part,"
        " since a Redis kept 70 % busy runs with its caches warm:",
        "",
        *rows,
    ]


def _write_cost(run: FleetRun) -> list[str]:
    """The gateway's physical limit (`bench.socket_limit`), beside its CPU per event in the tables."""
    cost = run.write_cost
    if cost is None:
        return []
    return [
        f"A gateway's physical limit in the same run (`bench.socket_limit`): a process that only writes"
        f" an event's chunk ({cost.chunk_bytes} bytes) to each of {cost.connections} loopback sockets in"
        f" turn, {ROUNDS_PER_SECOND:g} rounds a second, spends {us(cost.cpu_us_per_write)} µs of CPU"
        " a write. On loopback the kernel delivers to the reading socket, and wakes its reader, in the"
        " writer's system call: a write to a remote client costs less.",
        "",
    ]


def _request_cost(run: FleetRun) -> list[str]:
    """A long-poll's physical limit (`bench.request_limit`), beside the gateway's CPU per event."""
    cost = run.request_cost
    if cost is None:
        return []
    return [
        f"A long-poll's physical limit in the same run (`bench.request_limit`): the gateway's HTTP server"
        f" (uvicorn as the gateway runs it) with an application that only answers each request at once"
        f" with a long-poll page of one delta ({cost.page_bytes} bytes), {cost.requests_per_second:,.0f}"
        f" requests a second over {cost.connections} kept-alive connections (a gateway process's"
        f" long-polls at the largest level), spends {us(cost.cpu_us_per_request)} µs of CPU a request. A"
        " client polling at a stream's tip sends a request an event: this is the floor under the"
        " gateway's CPU per long-polled event.",
        "",
    ]


def _limits(run: FleetRun) -> list[str]:
    return [
        "| command | pipeline | per second | Redis CPU µs per command |",
        "| --- | --- | --- | --- |",
        *(
            f"| {limit.name} | {limit.pipeline} | {limit.per_second:,.0f} | {us(limit.redis_us)} |"
            for limit in [*run.limits, *([run.step_limit] if run.step_limit else [])]
        ),
    ]


def section(run: FleetRun) -> list[str]:
    """Section 9, from a run of `python -m bench.fleet` or of `make bench`."""
    plan = run.plan
    return [
        HEADING,
        "",
        f"Measured by `{run.command}` ({run.measured}, {run.minutes:.1f} minutes): {plan.workers} workers"
        f" on the synthetic engine, {gateways_text(plan)}, a client for every job in"
        f" {plan.client_processes} processes ({clients_text(plan)}), a private Redis. Each level runs"
        " `streams` jobs spread evenly over the workers, each worker's jobs stepping together at the rate"
        " asked on the worker's own clock, the workers started one after the other so"
        f" that their steps are out of phase. Redis is measured for {plan.unfollowed_seconds:g} s with"
        " nobody following the jobs (its CPU per event there is the steps': append, lease and cancel"
        f" checks, heartbeats), then for {plan.seconds:g} s with every job followed (all); relay = all -"
        " steps. Redis CPU is its own (INFO cpu) less what it spends idle"
        f" ({1e6 * run.idle_redis_cpu_per_second:.0f} µs/s); commandstats is the time Redis counts inside"
        " commands (scripts: EVALSHA and EVAL, the steps' with their XADDs, and the cursor checks of"
        " follows and long-polls; reads: XREAD, XRANGE, XREVRANGE),"
        " without parsing requests and writing replies, and timed by the clock, so that on a busy machine it"
        " can run past Redis's CPU. An event is one XADD (one job's delta of one step"
        + ("" if plan.stream_step == 1 else f"; here of {plan.stream_step} steps, its `stream_step`")
        + ");"
        " gateway and worker µs are their processes' CPU over the same window (the gateway's kernel"
        " part: mostly its writes to the clients' sockets). Lag: from the step's"
        " sending (its entries' `at`, whole ms, taken at the middle of the ms) to the client's receipt, for"
        " the events sent in the followed window. Sent, delivered, duplicated and reordered count every"
        " delta of the level, each client's against its job's stream. The levels:"
        f" {', '.join(map(str, plan.streams))} streams at {plan.rate:,.0f} events/s, then"
        f" {plan.rate_streams} streams at a rate raised {plan.rate_factor:g}x a level until a level is not"
        " sustained (lag p99 past 20 ms, an event lost, duplicated or reordered, or a follow failed). The"
        " rate made falls short of the rate asked by the synthetic engine's own pacing (it waits its step"
        " time after each step is published) and by a machine short of CPU. Clients µs: the load"
        " generator's own CPU, taken from the same cores. Machine busy: every core's share, whoever ran.",
        "",
        "Physical limits of the same Redis, `redis-benchmark` in the same run (50 connections; XADD of an"
        " event as a worker writes it; XREAD of one entry of one stream), and beside them the step script"
        " on the same busy Redis (`bench.step_limit`: calls of 256 jobs, a delta each, every job's lease"
        " read (it carries a cancel), sent back to back as `redis-benchmark` sends its commands):",
        "",
        *_limits(run),
        "",
        *_write_cost(run),
        *_request_cost(run),
        "Costs per event:",
        "",
        *_cost_rows(run),
        "",
        "Delivery, and lag in all and by the clients' kind (the events sent in the followed window):",
        "",
        *_delivery_rows(run),
        "",
        *_sizing_rows(run),
        "",
        *([f"The run stopped early: {run.stopped}.", ""] if run.stopped else []),
    ]


RELAY_STREAMS, RELAY_RATE = 1000, 10.0
"""DESIGN.md's relay target: 1,000 streams at 10 events a second each, through one gateway process."""
RELAY_TARGET_LABEL = "relay lag p99 <= 20 ms, 1,000 SSE streams x 10/s, one gateway"
RELAY_RATE_LABEL = "highest rate one gateway sustains vs redis-benchmark XADD"


def relay_targets(run: FleetRun | None) -> list[str]:
    """DESIGN.md's relay targets, judged on section 4's levels."""
    levels = run.levels if run is not None else []
    at_target = next(
        (
            level
            for level in levels
            if level.streams == RELAY_STREAMS and level.asked_rate == RELAY_STREAMS * RELAY_RATE
        ),
        None,
    )
    if run is None or at_target is None:
        return [f"| {RELAY_TARGET_LABEL} | not run | **missed** |", f"| {RELAY_RATE_LABEL} | not run | |"]
    d = at_target.delivery
    best = max(
        (level for level in levels if level.sustained), key=lambda level: level.asked_rate, default=None
    )
    best_text = f"{best.asked_rate:,.0f} events/s ({best.streams} streams)" if best else "no level sustained"
    xadd = ", ".join(
        f"P{limit.pipeline}: {limit.per_second:,.0f}/s" for limit in run.limits if limit.name == "XADD"
    )
    return [
        f"| {RELAY_TARGET_LABEL} | p99 {ms(at_target.lag(99))} ms, {d.delivered}/{d.sent} delivered"
        f" | {verdict(at_target.sustained)} |",
        f"| {RELAY_RATE_LABEL} | {best_text} vs {xadd} | (reported) |",
    ]


def relay_section(run: FleetRun) -> list[str]:
    """Section 4: one gateway process relaying every stream over SSE, at DESIGN.md's relay target and at
    rates raised past it, by the fleet's harness (section 9 says how it measures)."""
    plan = run.plan
    return [
        RELAY_HEADING,
        "",
        f"Measured by `{run.command}` ({run.measured}, {run.minutes:.1f} minutes), with the harness of"
        f" section 9: {plan.workers} workers on the synthetic engine, {gateways_text(plan)}, a client for"
        f" every job in {plan.client_processes} processes ({clients_text(plan)}), a private Redis."
        f" The levels: {', '.join(map(str, plan.streams))} streams at {plan.rate:,.0f} events/s in all,"
        f" then {plan.rate_streams} streams at a rate raised {plan.rate_factor:g}x a level until a level is"
        " not sustained (lag p99 past 20 ms, an event lost, duplicated or reordered, or a follow failed).",
        "",
        *_limits(run),
        "",
        "Costs per event:",
        "",
        *_cost_rows(run),
        "",
        "Delivery, and lag (the events sent in the followed window):",
        "",
        *_delivery_rows(run),
        "",
        *([f"The run stopped early: {run.stopped}.", ""] if run.stopped else []),
    ]
