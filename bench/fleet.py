"""The data plane at a fleet's rates: W workers on the synthetic engine, G gateway processes and a
client for every job, on a private Redis.

    python -m bench.fleet [--quick] [--workers W] [--gateways G] [--rate R] [--streams N ...]

Each level runs `streams` jobs spread over the workers (`worker_max_jobs` each), every worker's jobs
stepping together `steps_per_second` times a second on its own clock (`STREAMPOOL_ENGINE=synthetic`,
`synthetic_step_seconds`), the workers started apart so that their steps are out of phase. The jobs are
submitted by `JobStore.submit` and claimed by the workers as usual; once all run, Redis is measured with
nobody following them (the steps alone), then every job gets a client (`fleet_clients`: SSE, long-poll,
resuming from a cursor) through the gateways in turn, and the same is measured with all followed. The
jobs are then cancelled, the clients end with their streams, and what each received is checked against
its stream (`delivery`): sent, delivered, duplicated, reordered, and the lag from each step's sending
(its entries' `at`) to the client's receipt.

The levels: the followed streams from `streams` at a fixed total `rate` (events a second, the steps'
rate falling as the streams grow), then `rate_streams` streams at a rate raised by `rate_factor` a level
until a level is not sustained (lag p99 past 20 ms, an event lost, duplicated or reordered, or the
workers short of the rate asked). Beside them, `redis-benchmark` on the same Redis gives its physical
limits: XADD pipelined, and XREAD of one entry of one stream.

It writes its section of bench/RESULTS.md and its part of results.json in place; `make bench` runs it
as its last phase.
"""

from __future__ import annotations

import argparse
import asyncio
import math
import multiprocessing as mp
import multiprocessing.queues
import queue
import shlex
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import replace
from datetime import datetime, timezone
from multiprocessing.context import SpawnProcess
from multiprocessing.sharedctypes import Synchronized
from pathlib import Path

import psutil
import redis
import redis.asyncio as aioredis
import uvloop
from redis.typing import EncodableT, FieldT

from bench import fleet_report, redis_probe, report, system
from bench.delivery import Delivery, account, lags
from bench.fleet_clients import KINDS, ClientReport, Follow, client_process, kind_of
from bench.fleet_figures import FleetLevel, FleetPlan, FleetRun, Limit, Window
from bench.redis_probe import Probe
from shared.config import Settings
from shared.events import DeltaEvent
from shared.jobstore import JobStore
from shared.keys import Keys
from shared.requests import JobRequest
from tests.redis_cleanup import delete_prefix

OUT = Path(__file__).resolve().parent
SUBMIT_BATCH = 200
SETTLE_SECONDS = 1.0  # after the jobs run, and after the clients are live, before a window opens
START_TIMEOUT_SECONDS = 120.0  # for the jobs to run, and for the clients to be live
DRAIN_TIMEOUT_SECONDS = 60.0  # for the clients to end with their cancelled jobs
TOKENS_MARGIN_SECONDS = 120.0  # a job asks for tokens to last its level's windows and this much more
BENCHMARK_PIPELINE = 16
BENCHMARK_CLIENTS = 50


FULL = FleetPlan(4, 2, 4, 10_000.0, (250, 500, 1000, 2000, 4000), 2000, 1.5, 6, 10.0, 4.0, 1_000_000)
QUICK = FleetPlan(2, 2, 2, 2_000.0, (250, 1000), 250, 2.0, 2, 4.0, 2.0, 200_000)


def _cpu_seconds(processes: list[psutil.Process]) -> float:
    total = 0.0
    for process in processes:
        try:
            times = process.cpu_times()
        except psutil.NoSuchProcess:
            continue
        total += times.user + times.system
    return total


def _machine_cpu() -> tuple[float, float]:
    """The machine's CPU seconds so far, busy and in all, every core's added up."""
    times = psutil.cpu_times()
    total = float(sum(times))
    return total - times.idle - getattr(times, "iowait", 0.0), total


def limits(probe: Probe, keys: Keys, url: str, requests: int) -> list[Limit]:
    """redis-benchmark's XADD of an event as a worker writes it (pipelined), and XREAD of one such
    entry of one stream (alone and pipelined): Redis's ceiling, and its CPU per command there."""
    delta = DeltaEvent(seq=2, text=" token", token_ids=[0]).model_dump_json()
    fields = ("type", "delta", "data", delta, "at", str(time.time_ns() // 1_000_000))
    written, read = keys.stream("redis-benchmark-xadd"), keys.stream("redis-benchmark-xread")
    entry: dict[FieldT, EncodableT] = dict(zip(fields[::2], fields[1::2], strict=True))
    for entry_id in ("1-1", "2-1"):
        probe.client.xadd(read, entry, id=entry_id)
    commands = (
        ("XADD", BENCHMARK_PIPELINE, ("XADD", written, "MAXLEN", "~", "100000", "*", *fields)),
        ("XREAD of one stream", 1, ("XREAD", "COUNT", "1", "STREAMS", read, "1-1")),
        ("XREAD of one stream", BENCHMARK_PIPELINE, ("XREAD", "COUNT", "1", "STREAMS", read, "1-1")),
    )
    found = []
    for name, pipeline, command in commands:
        before = redis_probe.snapshot(probe.client)
        ceiling = redis_probe.benchmark(url, command, pipeline, requests, BENCHMARK_CLIENTS)
        busy = probe.busy(before, redis_probe.snapshot(probe.client))
        found.append(Limit(name, pipeline, requests, ceiling.requests_per_second, busy))
    probe.client.delete(written, read)
    return found


class Fleet:
    """The gateways (for every level) and the workers (a level's, started with its step rate)."""

    def __init__(self, settings: Settings, logs: Path, plan: FleetPlan, probe: Probe) -> None:
        self.settings = settings
        self.logs = logs
        self.plan = plan
        self.probe = probe
        self.gateways: list[system.Child] = []
        self.workers: list[system.Child] = []
        self.ports = [settings.port, *(system.free_port() for _ in range(plan.gateways - 1))]

    def start_gateways(self) -> None:
        for n, port in enumerate(self.ports):
            settings = self.settings.model_copy(update={"port": port})
            self.gateways.append(system.start(f"gateway-{n}", ["cli", "gateway"], settings, self.logs))
        for gateway, port in zip(self.gateways, self.ports, strict=True):
            system.wait_answering(self.settings.model_copy(update={"port": port}), gateway)

    async def start_jobs(self, store: JobStore, streams: int, steps_per_second: float) -> list[str]:
        """Start the workers one at a time, each given its share of `streams` jobs once it is ready, so
        that each claims its own (those before it are full) and its clock starts apart from theirs: their
        steps are out of phase. The running jobs, in order."""
        jobs = math.ceil(streams / self.plan.workers)
        asked = self.plan.unfollowed_seconds + self.plan.seconds + TOKENS_MARGIN_SECONDS
        max_tokens = math.ceil(steps_per_second * asked)
        job_ids: list[str] = []
        for n in range(self.plan.workers):
            settings = self.settings.model_copy(
                update={
                    "engine": "synthetic",
                    "synthetic_step_seconds": 1 / steps_per_second,
                    "synthetic_mean_tokens": 0,  # a job ends at max_tokens, or when cancelled
                    "worker_max_jobs": jobs,
                    "max_model_len": max(2048, max_tokens + 64),
                    "metrics_port": system.free_port(),
                }
            )
            self.workers.append(system.start(f"worker-{n}", ["cli", "worker"], settings, self.logs))
            system.wait_ready(self.settings, [*self.gateways, *self.workers], n + 1)
            share = await _submit(
                store, self.settings.model_name, min(jobs, streams - len(job_ids)), max_tokens
            )
            await _wait_running(store, share)
            job_ids += share
        return job_ids

    def stop_workers(self) -> None:
        while self.workers:
            self.workers.pop().stop()

    def stop(self) -> None:
        self.stop_workers()
        while self.gateways:
            self.gateways.pop().stop()

    def _cpu(self) -> tuple[float, float]:
        return (
            _cpu_seconds([gateway.handle for gateway in self.gateways]),
            _cpu_seconds([worker.handle for worker in self.workers]),
        )

    async def window(self, seconds: float, clients: list[psutil.Process]) -> tuple[Window, float, float]:
        """Measure for `seconds`: the window, and when it opened and closed (epoch seconds)."""
        before, (gateways, workers) = redis_probe.snapshot(self.probe.client), self._cpu()
        (busy, total), client_cpu, opened = _machine_cpu(), _cpu_seconds(clients), time.time()
        await asyncio.sleep(seconds)
        closed = time.time()
        after = redis_probe.snapshot(self.probe.client)
        gateways_after, workers_after = self._cpu()
        busy_after, total_after = _machine_cpu()
        calls = redis_probe.calls_between(before, after)
        window = Window(
            seconds=after.taken - before.taken,
            events=calls.get("xadd", 0),
            redis_cpu=self.probe.busy(before, after),
            gateway_cpu=gateways_after - gateways,
            worker_cpu=workers_after - workers,
            client_cpu=_cpu_seconds(clients) - client_cpu,
            machine_busy=(busy_after - busy) / (total_after - total),
            calls=calls,
            usec=redis_probe.usec_between(before, after),
        )
        return window, opened, closed


async def _submit(store: JobStore, model: str, count: int, max_tokens: int) -> list[str]:
    request = JobRequest(prompt="fleet", max_tokens=max_tokens)
    job_ids: list[str] = []
    for start in range(0, count, SUBMIT_BATCH):
        size = min(SUBMIT_BATCH, count - start)
        submissions = await asyncio.gather(
            *(store.submit(request, model=model, max_queued=0) for _ in range(size))
        )
        job_ids += [submission.job_id for submission in submissions]
    return job_ids


async def _wait_running(store: JobStore, job_ids: list[str]) -> None:
    deadline = time.monotonic() + START_TIMEOUT_SECONDS
    while time.monotonic() < deadline:
        pipe = store.redis.pipeline(transaction=False)
        for job_id in job_ids:
            pipe.hget(store.keys.job(job_id), "status")
        if all(status == "running" for status in await pipe.execute()):
            return
        await asyncio.sleep(0.2)
    raise RuntimeError(f"the {len(job_ids)} jobs were not all running after {START_TIMEOUT_SECONDS:g} s")


async def _sent(store: JobStore, job_ids: list[str]) -> dict[str, dict[int, int]]:
    """Each job's deltas as its stream holds them: seq to `at` (ms)."""
    sent: dict[str, dict[int, int]] = {}
    for start in range(0, len(job_ids), 100):
        batch = job_ids[start : start + 100]
        pipe = store.redis.pipeline(transaction=False)
        for job_id in batch:
            pipe.xrange(store.keys.stream(job_id))
        for job_id, entries in zip(batch, await pipe.execute(), strict=True):
            sent[job_id] = {
                int(entry_id.split("-")[0]): int(fields["at"])
                for entry_id, fields in entries
                if fields["type"] == "delta"
            }
    return sent


def _start_clients(
    job_ids: list[str], ports: list[int], processes: int, seconds: float
) -> tuple[list[SpawnProcess], Synchronized[int], mp.queues.Queue[ClientReport]]:
    context = mp.get_context("spawn")
    live: Synchronized[int] = context.Value("i", 0)
    results: mp.queues.Queue[ClientReport] = context.Queue()
    follows = [Follow(job_id, kind_of(n), ports[n % len(ports)]) for n, job_id in enumerate(job_ids)]
    shares = [follows[n::processes] for n in range(processes)]
    clients = [
        context.Process(target=client_process, args=(share, live, results, seconds))
        for share in shares
        if share
    ]
    for process in clients:
        process.start()
    return clients, live, results


async def _until_live(live: Synchronized[int], count: int, clients: list[SpawnProcess]) -> None:
    deadline = time.monotonic() + START_TIMEOUT_SECONDS
    while live.value < count:
        if time.monotonic() > deadline or any(not process.is_alive() for process in clients):
            raise RuntimeError(f"only {live.value} of {count} clients were live")
        await asyncio.sleep(0.1)


async def _report(results: mp.queues.Queue[ClientReport]) -> ClientReport:
    try:
        return await asyncio.to_thread(results.get, True, DRAIN_TIMEOUT_SECONDS)
    except queue.Empty:
        raise RuntimeError(f"a client process gave no report within {DRAIN_TIMEOUT_SECONDS:g} s") from None


def _account(
    job_ids: list[str],
    sent: dict[str, dict[int, int]],
    reports: list[ClientReport],
    window: tuple[float, float],
) -> tuple[Delivery, dict[str, list[float]], list[str]]:
    received = {job_id: item for report in reports for job_id, item in report.received.items()}
    failures = [failure for report in reports for failure in report.failures]
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
    fleet: Fleet, store: JobStore, streams: int, rate: float, on_progress: Callable[[str], None]
) -> FleetLevel:
    plan = fleet.plan
    steps_per_second = rate / streams
    on_progress(f"{streams} streams at {rate:,.0f} events/s: starting {plan.workers} workers and their jobs")
    try:
        job_ids = await fleet.start_jobs(store, streams, steps_per_second)
        await asyncio.sleep(SETTLE_SECONDS)
        on_progress(f"{streams} streams: measuring the steps, nobody following")
        unfollowed, _, _ = await fleet.window(plan.unfollowed_seconds, [])
        client_seconds = START_TIMEOUT_SECONDS + plan.seconds + DRAIN_TIMEOUT_SECONDS + 2 * SETTLE_SECONDS
        clients, live, results = _start_clients(job_ids, fleet.ports, plan.client_processes, client_seconds)
        try:
            on_progress(f"{streams} streams: connecting the clients")
            await _until_live(live, streams, clients)
            await asyncio.sleep(SETTLE_SECONDS)
            on_progress(f"{streams} streams: measuring, every stream followed")
            handles = [psutil.Process(process.pid) for process in clients if process.pid is not None]
            followed, opened, closed = await fleet.window(plan.seconds, handles)
            on_progress(f"{streams} streams: cancelling the jobs, draining the clients")
            for start in range(0, len(job_ids), SUBMIT_BATCH):
                await asyncio.gather(
                    *(store.cancel(job_id) for job_id in job_ids[start : start + SUBMIT_BATCH])
                )
            reports = [await _report(results) for _ in clients]
        finally:
            for process in clients:
                process.join(timeout=10)
                if process.is_alive():
                    process.terminate()
    finally:
        fleet.stop_workers()
    sent = await _sent(store, job_ids)
    delivery, by_kind, failures = _account(job_ids, sent, reports, (opened, closed))
    return FleetLevel(
        streams=streams,
        workers=plan.workers,
        gateways=plan.gateways,
        steps_per_second=steps_per_second,
        unfollowed=unfollowed,
        followed=followed,
        delivery=delivery,
        lags=by_kind,
        failures=failures,
    )


async def run_levels(fleet: Fleet, run: FleetRun, on_progress: Callable[[str], None]) -> None:
    """The levels of `streams` at the fixed rate, then the rate raised until a level is not sustained."""
    plan = fleet.plan
    client = aioredis.Redis.from_url(fleet.settings.redis_url, decode_responses=True)
    store = JobStore(client, Keys(fleet.settings.key_prefix), fleet.settings)
    try:
        for streams in plan.streams:
            run.levels.append(await run_level(fleet, store, streams, plan.rate, on_progress))
            on_progress(fleet_report.describe(run.levels[-1]))
        rate = plan.rate
        for _ in range(plan.rate_levels):
            rate *= plan.rate_factor
            level = await run_level(fleet, store, plan.rate_streams, rate, on_progress)
            run.levels.append(level)
            on_progress(fleet_report.describe(level))
            if not level.sustained:
                break
    finally:
        await client.aclose()


def measure(
    redis_url: str, plan: FleetPlan, logs: Path, command: str, on_progress: Callable[[str], None]
) -> FleetRun:
    """The whole phase on the Redis at `redis_url` (private to the run: its INFO counts this phase
    alone), under a key prefix of its own, deleted at the end."""
    began = time.monotonic()
    settings = system.bench_settings(redis_url)
    probe = Probe(redis.Redis.from_url(redis_url, decode_responses=True))
    run = FleetRun(command, datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"), plan)
    fleet = Fleet(settings, logs, plan, probe)
    try:
        run.idle_redis_cpu_per_second = probe.measure_idle()
        on_progress("redis-benchmark: the physical limits")
        run.limits = limits(probe, Keys(settings.key_prefix), redis_url, plan.limit_requests)
        on_progress(f"starting {plan.gateways} gateways")
        fleet.start_gateways()
        uvloop.run(run_levels(fleet, run, on_progress))
    finally:
        fleet.stop()
        delete_prefix(redis_url, settings.key_prefix)
    run.minutes = (time.monotonic() - began) / 60
    return run


def plan_of(args: argparse.Namespace) -> FleetPlan:
    """The plan of `--quick` or not, with what the other flags give in place of its own."""
    plan = QUICK if args.quick else FULL
    given = {name: value for name, value in vars(args).items() if name in FleetPlan.__dataclass_fields__}
    given = {name: value for name, value in given.items() if value is not None}
    if "streams" in given:
        given["streams"] = tuple(given["streams"])
    return replace(plan, **given)


def main_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        description=__doc__.splitlines()[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="a smoke run of under 2 minutes")
    parser.add_argument("--workers", type=int, help="worker processes")
    parser.add_argument("--gateways", type=int, help="gateway processes")
    parser.add_argument("--client-processes", type=int, help="processes the clients are spread over")
    parser.add_argument("--rate", type=float, help="events a second in all, at each level of --streams")
    parser.add_argument("--streams", type=int, nargs="+", help="followed streams of the fixed-rate levels")
    parser.add_argument("--rate-streams", type=int, help="followed streams of the levels that raise the rate")
    parser.add_argument("--rate-factor", type=float, help="the rate's rise from one level to the next")
    parser.add_argument("--rate-levels", type=int, help="most levels that raise the rate")
    parser.add_argument("--seconds", type=float, help="the followed window of each level")
    parser.add_argument("--unfollowed-seconds", type=float, help="the window with nobody following")
    parser.add_argument("--limit-requests", type=int, help="redis-benchmark requests for each limit")
    return parser


def main() -> None:
    args = main_parser().parse_args()
    plan = plan_of(args)
    logs = Path(tempfile.mkdtemp(prefix="streampool-fleet-"))
    redis_server, url = system.start_redis(logs)
    command = shlex.join(["python", "-m", "bench.fleet", *sys.argv[1:]])
    try:
        run = measure(url, plan, logs, command, lambda text: print(text, flush=True))
    finally:
        redis_server.terminate()
        redis_server.wait()
    path = report.write_fleet(run, OUT)
    print("\n".join(fleet_report.section(run)))
    print(f"wrote its section of {path} and its part of results.json ({run.minutes:.1f} min); logs: {logs}")


if __name__ == "__main__":
    main()
