"""The capacity of one Redis: its own CPU time per worker step and per relayed stream.

The machine is shared and noisy, so throughput alone would measure the neighbours. Redis counts
its own CPU time (INFO cpu), so each figure is Redis CPU seconds per unit of work, done at a steady
rate well below saturation, less what an idle Redis spends in the same time; one core divided by
the cost is the capacity. Then the same step calls are sent back to back, as fast as Redis takes
them (`bench.step_limit`), as a cross-check of the cost at saturation.

- Worker steps: jobs started through JobStore, stepped by the worker's own `Publisher` (one
  pipeline of one step script per job per step, the group commit) with one delta each.
- Relayed streams: the synthetic producer's appends followed by SSE clients through a real gateway
  (`relay_load`), less the same appends with nobody following (the appends are the step's cost).

    python -m bench.redis_capacity [--quick]

writes bench/REDIS_CAPACITY.md and bench/redis_capacity.json (a private redis-server, one gateway,
no worker, no engine).
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import shlex
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import redis
import redis.asyncio as aioredis

from bench import capacity_report, redis_probe, relay_load, step_limit, system
from bench.redis_probe import Probe
from bench.relay_load import RelayLevel
from bench.stats import percentile
from bench.synthetic_producer import WORKER_ID, SyntheticProducer
from shared.config import Settings
from shared.jobstore import JobStore
from shared.keys import Keys
from shared.lifecycle.transitions import Verdict
from tests.redis_cleanup import delete_prefix
from worker.publisher import Publisher

OUT = Path(__file__).resolve().parent


@dataclass(frozen=True)
class Plan:
    step_jobs: tuple[int, ...]
    step_rate: float  # worker steps a second, as a GPU worker's tokens/s per sequence
    steps: int
    saturation_calls: int  # step calls sent back to back at each number of jobs
    relay_levels: tuple[tuple[int, float, float], ...]  # (streams, events a second each, bursts a second)
    relay_seconds: float


FULL = Plan(
    (32, 256),
    20.0,
    400,
    300,
    ((250, 10.0, 100.0), (1000, 10.0, 100.0), (250, 40.0, 100.0), (1000, 10.0, 400.0)),
    10.0,
)
QUICK = Plan((32, 256), 20.0, 60, 60, ((250, 10.0, 100.0),), 4.0)


@dataclass(frozen=True)
class StepCost:
    """Redis CPU of one worker's steps at `jobs` running jobs, paced at `rate` steps a second."""

    jobs: int
    rate: float
    steps: int
    seconds: float
    redis_cpu_seconds: float  # less the idle share
    round_trips: int
    calls: dict[str, int]
    lifecycle_cpu_seconds: float  # submitting, starting and finishing the `jobs`, less the idle share

    @property
    def per_step(self) -> float:
        return self.redis_cpu_seconds / self.steps

    @property
    def per_script(self) -> float:
        return self.per_step / self.jobs


@dataclass(frozen=True)
class Saturation:
    """Step calls as a worker of `jobs` jobs sends them, sent back to back, as fast as Redis takes them."""

    jobs: int  # jobs a call
    job_steps: int
    job_steps_per_second: float
    redis_cpu_seconds: float
    seconds: float

    @property
    def per_job_step(self) -> float:
        return self.redis_cpu_seconds / self.job_steps

    @property
    def redis_cpu_percent(self) -> float:
        return 100 * self.redis_cpu_seconds / self.seconds


@dataclass(frozen=True)
class RelayCost:
    """One relay level: Redis CPU with its streams followed, less the same appends unfollowed."""

    level: RelayLevel
    bursts_per_second: float  # the producer's writes, each to a share of the streams, as workers' steps
    append_cpu_per_event: float  # the synthetic producer's XADD alone, nobody following

    @property
    def relay_cpu_seconds(self) -> float:
        """Redis CPU of the gateway's reads: the level's, less its appends."""
        return self.level.redis_cpu_seconds - self.append_cpu_per_event * self.level.sent

    @property
    def per_event(self) -> float:
        return self.relay_cpu_seconds / self.level.sent

    @property
    def per_followed_stream(self) -> float:
        """Redis CPU per second of one followed stream."""
        return self.relay_cpu_seconds / (self.level.streams * self.level.seconds)

    @property
    def reads(self) -> int:
        """The gateway's XREADs (its reader's blocking ones, and followers catching up)."""
        return self.level.redis_calls.get("xread", 0)

    @property
    def per_stream_read(self) -> float:
        """Redis CPU per stream named in a read: the reader names every stream it follows."""
        return self.relay_cpu_seconds / max(self.reads * self.level.streams, 1)


@dataclass
class Capacity:
    command: str
    idle_cpu_per_second: float
    steps: list[StepCost]
    saturation: list[Saturation]
    relay: list[RelayCost]


async def _step_all(publisher: Publisher, producer: SyntheticProducer, job_ids: list[str]) -> None:
    """One engine step of every job: the publisher gathers them into one pipeline."""
    sent = time.time()
    verdicts = await asyncio.gather(
        *(publisher.step(job_id, [producer.delta(job_id, sent)]) for job_id in job_ids)
    )
    if any(verdict is not Verdict.go for verdict in verdicts):
        raise RuntimeError(f"a step was refused: {set(verdicts)}")


async def step_cost(
    probe: Probe, client: aioredis.Redis, store: JobStore, jobs: int, rate: float, steps: int
) -> StepCost:
    """Step `jobs` running jobs `steps` times at `rate` steps a second, then end them; the cost."""
    producer = SyntheticProducer(client, store)
    publisher = Publisher(client, store, WORKER_ID)
    created = redis_probe.snapshot(probe.client)
    job_ids = await producer.create(jobs)
    lifecycle = probe.busy(created, redis_probe.snapshot(probe.client))
    await _step_all(publisher, producer, job_ids)  # loads the step script (NOSCRIPT) before the window
    trips = publisher.round_trips
    before = redis_probe.snapshot(probe.client)
    for step in range(steps):
        await asyncio.sleep(max(0.0, before.taken + step / rate - time.monotonic()))
        await _step_all(publisher, producer, job_ids)
    after = redis_probe.snapshot(probe.client)
    finishing = redis_probe.snapshot(probe.client)
    await producer.finish(job_ids)
    lifecycle += probe.busy(finishing, redis_probe.snapshot(probe.client))
    return StepCost(
        jobs=jobs,
        rate=rate,
        steps=steps,
        seconds=after.taken - before.taken,
        redis_cpu_seconds=probe.busy(before, after),
        round_trips=publisher.round_trips - trips,
        calls=redis_probe.calls_between(before, after),
        lifecycle_cpu_seconds=lifecycle,
    )


def saturate(probe: Probe, prefix: str, jobs: int, calls: int) -> Saturation:
    """Step calls of `jobs` jobs each, sent back to back as fast as Redis takes them (`bench.step_limit`)."""
    limit = step_limit.measure(probe, prefix, jobs, calls)
    return Saturation(
        jobs, limit.requests, limit.per_second, limit.redis_cpu, limit.requests / limit.per_second
    )


async def append_cost(
    probe: Probe, producer: SyntheticProducer, streams: int, rate: float, seconds: float, tick: float
) -> float:
    """Redis CPU per event of the producer's appends, with no one following the streams."""
    job_ids = await producer.create(streams)
    before = redis_probe.snapshot(probe.client)
    production = await producer.produce(job_ids, rate, seconds, tick)
    after = redis_probe.snapshot(probe.client)
    await producer.finish(job_ids)
    return probe.busy(before, after) / production.events


async def relay_costs(probe: Probe, settings: Settings, gateway: system.Child, plan: Plan) -> list[RelayCost]:
    client = aioredis.Redis.from_url(settings.redis_url, decode_responses=True)
    producer = SyntheticProducer(client, JobStore(client, Keys(settings.key_prefix), settings))
    redis_port = probe.client.connection_pool.connection_kwargs["port"]
    costs = []
    for streams, rate, bursts in plan.relay_levels:
        append = await append_cost(probe, producer, streams, rate, plan.relay_seconds, 1 / bursts)
        level = await relay_load.run_level(
            producer,
            gateway,
            probe.client,
            settings.port,
            redis_port,
            streams,
            rate,
            plan.relay_seconds,
            relay_load.CLIENT_PROCESSES,
            lambda text: None,
            1 / bursts,
        )
        level = dataclasses.replace(
            level, redis_cpu_seconds=level.redis_cpu_seconds - probe.idle_rate * level.seconds
        )
        costs.append(RelayCost(level, bursts, append))
        print(capacity_report.describe_relay(costs[-1]), flush=True)
    await client.aclose()
    return costs


async def worker_steps(probe: Probe, settings: Settings, plan: Plan, capacity: Capacity) -> None:
    client = aioredis.Redis.from_url(settings.redis_url, decode_responses=True)
    store = JobStore(client, Keys(settings.key_prefix), settings)
    for jobs in plan.step_jobs:
        cost = await step_cost(probe, client, store, jobs, plan.step_rate, plan.steps)
        capacity.steps.append(cost)
        print(capacity_report.describe_steps(cost), flush=True)
        saturation = saturate(probe, settings.key_prefix, jobs, plan.saturation_calls)
        capacity.saturation.append(saturation)
        print(capacity_report.describe_saturation(saturation), flush=True)
    await client.aclose()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a smoke run of under a minute")
    args = parser.parse_args()
    plan = QUICK if args.quick else FULL
    logs = Path(tempfile.mkdtemp(prefix="streampool-capacity-"))
    redis_server, url = system.start_redis(logs)
    settings = system.bench_settings(url)
    probe = Probe(redis.Redis.from_url(url, decode_responses=True))
    capacity = Capacity(shlex.join(["python", "-m", "bench.redis_capacity", *sys.argv[1:]]), 0.0, [], [], [])
    gateway = None
    try:
        capacity.idle_cpu_per_second = probe.measure_idle()
        asyncio.run(worker_steps(probe, settings, plan, capacity))
        gateway = system.start_gateway(settings, logs)
        system.wait_answering(settings, gateway)
        capacity.relay = asyncio.run(relay_costs(probe, settings, gateway, plan))
    finally:
        if gateway is not None:
            gateway.stop()
        delete_prefix(url, settings.key_prefix)
        redis_server.terminate()
        redis_server.wait()
    raw = dataclasses.asdict(capacity)
    for item in raw["relay"]:
        lags = item["level"]["lags"]
        item["level"]["lags"] = {f"p{q}": percentile(lags, q) for q in (50, 99, 100)}
    (OUT / "redis_capacity.json").write_text(json.dumps(raw, indent=1))
    path = OUT / "REDIS_CAPACITY.md"
    path.write_text("\n".join(capacity_report.render(capacity)) + "\n")
    print(f"wrote {path}; logs: {logs}")


if __name__ == "__main__":
    main()
