"""Redis commands and round trips per engine step per worker, at a given number of running jobs.

Commands come from Redis's own INFO commandstats (a private server, so only this system's commands).
Round trips come from the worker's own metric, `streampool_worker_redis_round_trips_total`. Steps are
the tokens of the longest job: all jobs are submitted at once with stream_step 1, so they decode in
lockstep and each step yields one token per job; a job that starts a step late only makes the step
count (and so the per-step figures) err on the high side."""

from __future__ import annotations

import asyncio

import httpx
import redis
from prometheus_client.parser import text_string_to_metric_families

from bench import redis_probe
from bench.engine_figures import StepCost
from bench.jobclient import run_job
from bench.workload import request

SETTLE_SECONDS = 0.3  # for the last commands of what ran before to be counted before, not during
ROUND_TRIPS = "streampool_worker_redis_round_trips"
STEP_COMMANDS = ("xadd", "exists", "eval")  # what the publisher sends: appends, cancel checks, finish


async def round_trips(http: httpx.AsyncClient, worker_metrics_url: str) -> int:
    """The worker's publisher's round trips so far, from its /metrics."""
    answer = await http.get(worker_metrics_url)
    answer.raise_for_status()
    for family in text_string_to_metric_families(answer.text):
        if family.name == ROUND_TRIPS:
            return int(family.samples[0].value)
    raise RuntimeError(f"{worker_metrics_url} has no {ROUND_TRIPS}")


async def measure(
    http: httpx.AsyncClient, sync_redis: redis.Redis, worker_metrics_url: str, jobs: int, max_tokens: int
) -> StepCost:
    await asyncio.sleep(SETTLE_SECONDS)
    before, trips_before = redis_probe.snapshot(sync_redis), await round_trips(http, worker_metrics_url)
    followed = await asyncio.gather(*(run_job(http, request(n, max_tokens)) for n in range(jobs)))
    await asyncio.sleep(SETTLE_SECONDS)
    after, trips_after = redis_probe.snapshot(sync_redis), await round_trips(http, worker_metrics_url)
    steps = max(item.timing.tokens for item in followed)
    return StepCost(jobs, steps, redis_probe.calls_between(before, after), trips_after - trips_before)
