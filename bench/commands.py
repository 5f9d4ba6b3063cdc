"""Redis commands and round trips per engine step per worker, at a given number of running jobs.

Commands come from Redis's own INFO commandstats (a private server, so only this system's commands).
Round trips come from the worker's publisher counter (bench.probe_worker). Steps are the tokens of the
longest job: all jobs are submitted at once with stream_step 1, so they decode in lockstep and each step
yields one token per job; a job that starts a step late only makes the step count (and so the per-step
figures) err on the high side."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from pathlib import Path

import httpx
import redis

from bench import redis_probe
from bench.jobclient import run_job
from bench.probe_worker import read_round_trips
from bench.workload import request

SETTLE_SECONDS = 0.3  # longer than the probe worker's counter dump interval
STEP_COMMANDS = ("xadd", "exists", "eval")  # what the publisher sends: appends, cancel checks, finish


@dataclass(frozen=True)
class StepCost:
    jobs: int
    steps: int
    calls: dict[str, int]
    round_trips: int

    def per_step(self, *names: str) -> float:
        return sum(self.calls.get(name, 0) for name in names) / self.steps

    @property
    def all_per_step(self) -> float:
        return sum(self.calls.values()) / self.steps

    @property
    def round_trips_per_step(self) -> float:
        return self.round_trips / self.steps


async def measure(
    http: httpx.AsyncClient, sync_redis: redis.Redis, counters: Path, jobs: int, max_tokens: int
) -> StepCost:
    await asyncio.sleep(SETTLE_SECONDS)
    before, trips_before = redis_probe.snapshot(sync_redis), read_round_trips(counters)
    followed = await asyncio.gather(*(run_job(http, request(n, max_tokens)) for n in range(jobs)))
    await asyncio.sleep(SETTLE_SECONDS)
    after, trips_after = redis_probe.snapshot(sync_redis), read_round_trips(counters)
    steps = max(item.timing.tokens for item in followed)
    return StepCost(jobs, steps, redis_probe.calls_between(before, after), trips_after - trips_before)
