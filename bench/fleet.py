"""The data plane at a fleet's rates: W workers on the synthetic engine, G gateway processes and a
client for every job, on a private Redis.

    python -m bench.fleet [--quick] [--relay] [--workers W] [--gateways G] [--rate R] [--streams N ...]
                          [--clients {mixed,sse,long-poll,resume}] [--stream-step K]

Each level runs `streams` jobs spread over the workers (`worker_max_jobs` each), every worker's jobs
stepping together `steps_per_second` times a second on its own clock (`STREAMPOOL_ENGINE=synthetic`,
`synthetic_step_seconds`), the workers started apart so that their steps are out of phase. The jobs are
submitted by `JobStore.submit` and claimed by the workers as usual; once all run, Redis is measured with
nobody following them (the steps alone), then every job gets a client (`fleet_clients`: SSE, long-poll,
resuming from a cursor) through the gateways in turn, and the same is measured with all followed. The
jobs are then cancelled, the clients end with their streams, and what each received is checked against
its stream (`delivery`): sent, delivered, duplicated, reordered, and the lag from each step's sending
(its entries' `at`) to the client's receipt. With `--stream-step K` each job's events carry K tokens
(its `stream_step`), its steps running K times as fast, so that a level's events a second stay as asked.

The levels: the followed streams from `streams` at a fixed total `rate` (events a second, the steps'
rate falling as the streams grow), then `rate_streams` streams at a rate raised by `rate_factor` a level
until a level is not sustained (lag p99 past 20 ms, or an event lost, duplicated or reordered). Beside
them, `redis-benchmark` on the same Redis gives its physical limits: XADD pipelined, and XREAD of one
entry of one stream; `bench.step_limit` the step script's cost a job on a busy Redis, as
`redis-benchmark` takes its limits; `bench.socket_limit` a gateway's: the CPU one event's write to a
client's socket costs a process that does nothing else; and `bench.request_limit` a long-poll's: the CPU
the gateway's HTTP server spends on a request answered at once, at the long-polls' own rate.

Run alone it puts its part into bench/results.json (`fleet`, or `fleet_cluster` with `--masters`), from
which RESULTS.md is rendered again (`report.record`); `make bench` runs it once no engine is alive, and
again at one gateway process over SSE alone (`RELAY`: DESIGN.md's relay target, section 4).
"""

from __future__ import annotations

import argparse
import asyncio
import shlex
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import replace
from datetime import datetime, timezone
from pathlib import Path

import redis
import redis.asyncio as aioredis
import uvloop

from bench import (
    fleet_cluster_report,
    fleet_report,
    redis_probe,
    report,
    request_limit,
    socket_limit,
    step_limit,
    system,
)
from bench.delivery import Delivery, account, lags
from bench.fleet_clients import CLIENT_MIXES, KINDS, LONG_POLL, SSE, ClientReport, Clients, kind_of
from bench.fleet_figures import FleetLevel, FleetPlan, FleetRun, Lifecycle, lags_by_kind
from bench.fleet_system import BATCH, START_TIMEOUT_SECONDS, Fleet
from bench.limit_figures import RequestCost
from bench.redis_cluster import Cluster, partition_slots
from bench.redis_probe import Probe
from shared.config import Settings
from shared.jobstore import JobStore
from shared.keys import Keys
from shared.redis_client import connect_streams
from tests.redis_cleanup import delete_prefix

SETTLE_SECONDS = 1.0  # after the jobs run, and after the clients are live, before a window opens
DRAIN_TIMEOUT_SECONDS = 60.0  # for the clients to end with their cancelled jobs
REQUEST_LIMIT_REQUESTS = 2000  # long-polls in `request_limit`'s run: a window that averages many wake-ups

# The levels: a fleet's rate over 250 to 4,000 followed streams (on a machine that has the cores).
FULL = FleetPlan(
    workers=4,
    gateways=2,
    client_processes=4,
    rate=10_000.0,
    streams=(250, 500, 1000, 2000, 4000),
    rate_streams=2000,
    rate_factor=1.5,
    rate_levels=6,
    seconds=10.0,
    unfollowed_seconds=4.0,
    limit_requests=1_000_000,
)
# Scaled to a 2-core machine, under 2 minutes.
QUICK = FleetPlan(
    workers=2,
    gateways=2,
    client_processes=2,
    rate=2_000.0,
    streams=(250, 1000),
    rate_streams=250,
    rate_factor=2.0,
    rate_levels=2,
    seconds=4.0,
    unfollowed_seconds=2.0,
    limit_requests=100_000,
)
# DESIGN.md's relay target (RESULTS.md's section 4): one gateway process, 1,000 streams followed over SSE
# at 10 events/s each, then the rate of those streams raised 1.5x a level until one is not sustained.
RELAY = replace(
    FULL, gateways=1, client_processes=2, streams=(1000,), rate_streams=1000, rate_levels=4, clients=SSE
)
RELAY_QUICK = replace(
    RELAY, workers=2, rate_levels=0, seconds=4.0, unfollowed_seconds=2.0, limit_requests=100_000
)


def _account(
    job_ids: list[str],
    sent: dict[str, dict[int, int]],
    reports: list[ClientReport],
    window: tuple[float, float],
) -> tuple[Delivery, dict[str, list[float]], list[str]]:
    """The level's delivery, its lags by the clients' kind (of the deltas sent in `window`), and its
    failed follows."""
    received = {job_id: item for client in reports for job_id, item in client.received.items()}
    failures = [failure for client in reports for failure in client.failures]
    delivery, by_kind = Delivery(), {kind: list[float]() for kind in KINDS}
    for job_id in job_ids:
        item = received.get(job_id)
        if item is None:
            failures.append(f"{job_id}: no client reported it")
            delivery += account(sent[job_id], [])
            continue
        delivery += account(sent[job_id], item.seqs)
        by_kind[item.kind] += lags(item.seqs, item.arrivals, sent[job_id], *window)
    return delivery, by_kind, failures


async def run_level(
    fleet: Fleet, streams: int, rate: float, on_progress: Callable[[str], None]
) -> FleetLevel:
    """`streams` jobs making `rate` events a second in all, measured unfollowed, then followed."""
    plan = fleet.plan
    steps_per_second = rate * plan.stream_step / streams
    on_progress(f"{streams} streams at {rate:,.0f} events/s: starting {plan.workers} workers and their jobs")
    try:
        job_ids = await fleet.start_jobs(streams, steps_per_second)
        await asyncio.sleep(SETTLE_SECONDS)
        on_progress(f"{streams} streams: measuring the steps, nobody following")
        unfollowed, _, _ = await fleet.window(plan.unfollowed_seconds, [])
        client_seconds = START_TIMEOUT_SECONDS + plan.seconds + DRAIN_TIMEOUT_SECONDS + 2 * SETTLE_SECONDS
        clients = Clients(job_ids, fleet.ports, plan.client_processes, client_seconds, plan.clients)
        try:
            on_progress(f"{streams} streams: connecting the clients")
            await clients.until_settled(START_TIMEOUT_SECONDS)
            await asyncio.sleep(SETTLE_SECONDS)
            on_progress(f"{streams} streams: measuring, every stream followed")
            followed, opened, closed = await fleet.window(plan.seconds, clients.handles)
            on_progress(f"{streams} streams: cancelling the jobs, draining the clients")
            ending = redis_probe.snapshot(fleet.probe.client)
            await fleet.cancel(job_ids)
            reports = await clients.reports(DRAIN_TIMEOUT_SECONDS)
            lifecycle = Lifecycle(len(job_ids), *fleet.starting, *fleet.control_since(ending))
        finally:
            clients.stop()
    finally:
        fleet.stop_workers()
    delivery, by_kind, failures = _account(job_ids, await fleet.sent(job_ids), reports, (opened, closed))
    return FleetLevel(
        streams=streams,
        workers=plan.workers,
        gateways=plan.gateways,
        steps_per_second=steps_per_second,
        unfollowed=unfollowed,
        followed=followed,
        delivery=delivery,
        lags=lags_by_kind(by_kind),
        failures=failures,
        masters=len(fleet.masters),
        lifecycle=lifecycle if fleet.masters else None,  # on one Redis the steps run meanwhile
        stream_step=plan.stream_step,
    )


def next_level(plan: FleetPlan, done: list[FleetLevel]) -> tuple[int, float] | None:
    """The level (streams, events/s in all) to run after the levels `done`, or None: the levels of
    `streams` at the fixed rate, then `rate_streams` at the rate raised, until one is not sustained."""
    fixed = [(streams, plan.rate) for streams in plan.streams]
    if len(done) < len(fixed):
        return fixed[len(done)]
    raised = len(done) - len(fixed)
    if raised >= plan.rate_levels or (raised and not done[-1].sustained):
        return None
    return plan.rate_streams, plan.rate * plan.rate_factor ** (raised + 1)


async def run_levels(fleet: Fleet, run: FleetRun, on_progress: Callable[[str], None]) -> None:
    """Every level of the plan in turn; a level that cannot be run (the fleet broke down: workers or
    clients that did not start, jobs that did not run) ends the run, which keeps the levels before it."""
    while (level := next_level(fleet.plan, run.levels)) is not None:
        streams, rate = level
        try:
            run.levels.append(await run_level(fleet, streams, rate, on_progress))
        except RuntimeError as exc:
            run.stopped = f"{streams} streams at {rate:,.0f} events/s could not be run: {exc}"
            on_progress(run.stopped)
            return
        on_progress(fleet_report.describe(run.levels[-1]))


async def run_fleet(
    settings: Settings,
    logs: Path,
    plan: FleetPlan,
    probe: Probe,
    run: FleetRun,
    on_progress: Callable[[str], None],
    masters: list[Probe] | None = None,
) -> None:
    """Start the gateways, run the levels, stop every process started. `masters`: the streams' Redis
    Cluster's (`settings.streams_redis_url`), when the streams are on one."""
    client = aioredis.Redis.from_url(settings.redis_url, decode_responses=True)
    keys, url = Keys.of(settings), settings.streams_redis_url
    # as many connections to each master as the harness sends commands at once
    streams = None if url is None else connect_streams(url, keys.client_name("bench"), BATCH)
    fleet = Fleet(settings, logs, plan, probe, JobStore(client, keys, settings, streams), masters)
    try:
        on_progress(f"starting {plan.gateways} gateways")
        fleet.start_gateways()
        await run_levels(fleet, run, on_progress)
    finally:
        fleet.stop()
        await client.aclose()
        if streams is not None:
            await streams.aclose()


def measure(
    redis_url: str, plan: FleetPlan, logs: Path, command: str, on_progress: Callable[[str], None]
) -> FleetRun:
    """The whole phase on the Redis at `redis_url` (private to the run: its INFO counts this phase
    alone), under a key prefix of its own, deleted at the end."""
    began = time.monotonic()
    settings = system.bench_settings(redis_url)
    keys = Keys(settings.key_prefix)
    probe = Probe(redis.Redis.from_url(redis_url, decode_responses=True))
    run = FleetRun(command, datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"), plan)
    try:
        run.idle_redis_cpu_per_second = probe.measure_idle()
        on_progress("redis-benchmark: the physical limits")
        written, read = keys.stream("redis-benchmark-xadd"), keys.stream("redis-benchmark-xread")
        run.limits = redis_probe.stream_limits(probe, redis_url, written, read, plan.limit_requests)
        on_progress("the step script on a busy Redis")
        run.step_limit = step_limit.measure(probe, settings.key_prefix)
        on_progress("one event's write to a client's socket: the gateway's physical limit")
        run.write_cost = socket_limit.measure(max(plan.streams) // plan.gateways)
        run.request_cost = long_poll_floor(plan, on_progress)
        uvloop.run(run_fleet(settings, logs, plan, probe, run, on_progress))
    finally:
        delete_prefix(redis_url, settings.key_prefix)
    run.minutes = (time.monotonic() - began) / 60
    return run


def long_polls_of_a_gateway_process(plan: FleetPlan) -> tuple[int, float] | None:
    """The long-polls one gateway process serves at the largest fixed-rate level: its connections, and
    its requests a second (one an event, at a stream's tip); None where no client long-polls."""
    streams = max(plan.streams)
    polling = sum(kind_of(index, plan.clients) == LONG_POLL for index in range(streams))
    if not polling:
        return None
    processes = plan.gateways * plan.gateway_processes
    return max(1, polling // processes), plan.rate * polling / streams / processes


def long_poll_floor(plan: FleetPlan, on_progress: Callable[[str], None]) -> RequestCost | None:
    """`bench.request_limit` at a gateway process's long-polls (`long_polls_of_a_gateway_process`), its
    window long enough to average many wake-ups, or twice the plan's followed window if that is
    shorter (a quick run's), and never shorter than `request_limit`'s own."""
    load = long_polls_of_a_gateway_process(plan)
    if load is None:
        return None
    connections, rate = load
    on_progress("one long-poll's request to the gateway's server: a long-poll's physical limit")
    seconds = max(request_limit.SECONDS, min(2 * plan.seconds, REQUEST_LIMIT_REQUESTS / rate))
    return request_limit.measure(connections, rate, seconds)


def measure_clustered(
    plan: FleetPlan, logs: Path, command: str, on_progress: Callable[[str], None]
) -> FleetRun:
    """The plan's levels once per count of `plan.masters`, the streams on a private Redis Cluster of
    as many masters (`redis_cluster.Cluster`, started anew for each), the control plane on a private
    Redis of its own for the whole run; no physical limits (the one Redis's run measures them)."""
    began = time.monotonic()
    control_server, control_url = system.start_redis(logs)
    control = Probe(redis.Redis.from_url(control_url, decode_responses=True))
    run = FleetRun(command, datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"), plan)
    idle_rates: list[float] = []
    try:
        for count in plan.masters:
            partitions = (
                {} if plan.stream_partitions is None else {"stream_partitions": plan.stream_partitions}
            )
            settings = system.bench_settings(control_url, **partitions)
            keys = Keys(settings.key_prefix, settings.stream_partitions)
            on_progress(f"{count} masters: starting the cluster")
            on_masters = logs / f"masters-{count}"  # its processes' logs
            cluster = Cluster.start(count, partition_slots(keys), on_masters)
            part = FleetRun(command, run.measured, plan)
            try:
                masters = [Probe(cluster.client(n)) for n in range(count)]
                idle_rates += redis_probe.measure_idle([control, *masters])
                settings = settings.model_copy(update={"streams_redis_url": cluster.url})
                uvloop.run(run_fleet(settings, on_masters, plan, control, part, on_progress, masters))
            finally:
                cluster.stop()
            run.levels += part.levels
            if part.stopped:
                run.stopped = f"on {count} masters, {part.stopped}"
                break
    finally:
        control_server.terminate()
        control_server.wait()
    run.idle_redis_cpu_per_second = sum(idle_rates) / max(len(idle_rates), 1)  # each server's, on average
    run.minutes = (time.monotonic() - began) / 60
    return run


def plan_of(args: argparse.Namespace) -> FleetPlan:
    """The plan of `--quick` or not (of `--relay`: `RELAY` or `RELAY_QUICK`), with what the other flags
    give in place of its own."""
    plan = (RELAY_QUICK if args.quick else RELAY) if args.relay else (QUICK if args.quick else FULL)
    given = {name: value for name, value in vars(args).items() if name in FleetPlan.__dataclass_fields__}
    given = {name: value for name, value in given.items() if value is not None}
    for name in ("streams", "masters"):
        if name in given:
            given[name] = tuple(given[name])
    return replace(plan, **given)


def main_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        description=__doc__.splitlines()[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="a smoke run of under 2 minutes")
    parser.add_argument(
        "--relay",
        action="store_true",
        help="DESIGN.md's relay target (section 4): one gateway process, 1,000 streams over SSE at 10 events"
        " a second each, then their rate raised until a level is not sustained",
    )
    parser.add_argument("--workers", type=int, help="worker processes")
    parser.add_argument("--gateways", type=int, help="gateways, each on a port of its own")
    parser.add_argument("--gateway-processes", type=int, help="processes of each gateway, on its one port")
    parser.add_argument("--client-processes", type=int, help="processes the clients are spread over")
    parser.add_argument("--rate", type=float, help="events a second in all, at each level of --streams")
    parser.add_argument("--streams", type=int, nargs="+", help="followed streams of the fixed-rate levels")
    parser.add_argument("--rate-streams", type=int, help="followed streams of the levels that raise the rate")
    parser.add_argument("--rate-factor", type=float, help="the rate's rise from one level to the next")
    parser.add_argument("--rate-levels", type=int, help="most levels that raise the rate")
    parser.add_argument("--seconds", type=float, help="the followed window of each level")
    parser.add_argument("--unfollowed-seconds", type=float, help="the window with nobody following")
    parser.add_argument("--limit-requests", type=int, help="redis-benchmark requests for each limit")
    parser.add_argument(
        "--clients",
        choices=CLIENT_MIXES,
        help="how the clients follow: the mix (default: one in ten long-polls, one in ten resumes, the rest"
        " SSE), or every client one way, to measure that one's cost alone",
    )
    parser.add_argument(
        "--masters",
        type=int,
        nargs="+",
        help="the streams on a private Redis Cluster of each many masters in turn (no replicas), the"
        " control plane on a Redis of its own: every level once per count",
    )
    parser.add_argument("--stream-partitions", type=int, help="with --masters: the streams' partitions")
    parser.add_argument(
        "--stream-step",
        type=int,
        help="each job's stream_step (tokens an event): its steps run that many times faster, at the same"
        " events a second",
    )
    return parser


def main() -> None:
    args = main_parser().parse_args()
    plan = plan_of(args)
    logs = Path(tempfile.mkdtemp(prefix="streampool-fleet-"))
    command = shlex.join(["python", "-m", "bench.fleet", *sys.argv[1:]])
    if plan.masters:
        run = measure_clustered(plan, logs, command, lambda text: print(text, flush=True))
        path = report.record(fleet_cluster=run)
        print("\n".join(fleet_cluster_report.section(run)))
    else:
        redis_server, url = system.start_redis(logs)
        try:
            run = measure(url, plan, logs, command, lambda text: print(text, flush=True))
        finally:
            redis_server.terminate()
            redis_server.wait()
        path = report.record(**{"relay" if args.relay else "fleet": run})
        print("\n".join((fleet_report.relay_section if args.relay else fleet_report.section)(run)))
    print(f"wrote its part of results.json and rendered {path} ({run.minutes:.1f} min); logs: {logs}")


if __name__ == "__main__":
    main()
