"""What the console's job index costs a submission: Redis's own time for the submit script with the
index and without it, in one run.

`python -m bench.submit_index [--quick]` runs alone, on a private redis-server (no gateway, no worker):
`JobStore.submit` of tiny jobs on a model no worker serves, in rounds that alternate a store that
writes the index (`job_index_size` 10,000, the index already full, so that each submission also trims
one entry, as in a steady state) and one that writes none (`job_index_size` 0). Per arm: Redis's
microseconds per EVALSHA (INFO commandstats: the submit script is the only script a submission
runs), the submission's round trip p50 as this process sees it, and the index's memory. It puts its
part into results.json (`submit_index`), and RESULTS.md is rendered again (section 10).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shlex
import sys
import tempfile
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

import redis.asyncio as aioredis

from bench import report, system
from bench.stats import percentile
from bench.submit_index_figures import INDEX_SIZE, SubmitIndexCost
from shared.config import Settings
from shared.jobstore import JobStore
from shared.keys import Keys
from shared.requests import JobRequest

MODEL = "submit-index-bench"  # no worker serves it: the jobs stay queued
REQUEST = JobRequest(prompt="Hi", max_tokens=1)


@dataclass(frozen=True)
class Plan:
    rounds: int
    submissions: int  # per arm and round


FULL = Plan(rounds=20, submissions=500)
QUICK = Plan(rounds=4, submissions=250)


@dataclass
class Arm:
    """One store's submissions over every round."""

    index_size: int
    calls: int = 0
    usec: int = 0
    trips: list[float] | None = None

    @property
    def usec_per_submit(self) -> float:
        return self.usec / self.calls

    @property
    def trip_p50_us(self) -> float:
        return percentile(self.trips or [], 50) * 1e6


async def _evalsha(redis: aioredis.Redis) -> tuple[int, int]:
    stats = (await redis.info("commandstats")).get("cmdstat_evalsha", {"calls": 0, "usec": 0})
    return int(stats["calls"]), int(stats["usec"])


async def _run(arm: Arm, store: JobStore, submissions: int) -> None:
    calls, usec = await _evalsha(store.redis)
    trips = arm.trips if arm.trips is not None else []
    for _ in range(submissions):
        began = time.perf_counter()
        await store.submit(REQUEST, model=MODEL, max_queued=0)
        trips.append(time.perf_counter() - began)
    calls_after, usec_after = await _evalsha(store.redis)
    arm.calls += calls_after - calls
    arm.usec += usec_after - usec
    arm.trips = trips


async def measure(settings: Settings, plan: Plan, command: str) -> SubmitIndexCost:
    load = os.getloadavg()[0]
    redis = aioredis.Redis.from_url(settings.redis_url, decode_responses=True)
    keys = Keys.of(settings)
    try:
        # The index full from the start: every indexed submission trims one entry, as in a steady state.
        await redis.zadd(keys.job_index, {f"{number:032x}": number for number in range(INDEX_SIZE)})
        arms = [Arm(INDEX_SIZE), Arm(0)]
        stores = [
            JobStore(redis, keys, settings.model_copy(update={"job_index_size": arm.index_size}))
            for arm in arms
        ]
        for store in stores:  # warm: the script loaded, the connections open
            await store.submit(REQUEST, model=MODEL, max_queued=0)
        for number in range(plan.rounds):  # each arm first in every other round: what drifts falls on both
            pairs = list(zip(arms, stores, strict=True))
            for arm, store in pairs if number % 2 == 0 else pairs[::-1]:
                await _run(arm, store, plan.submissions)
        index_bytes = int(await redis.memory_usage(keys.job_index) or 0)
        with_index, without = arms
        return SubmitIndexCost(
            measured=datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
            command=command,
            rounds=plan.rounds,
            submissions=plan.submissions,
            with_index=with_index.usec_per_submit,
            without_index=without.usec_per_submit,
            trip_with_us=with_index.trip_p50_us,
            trip_without_us=without.trip_p50_us,
            index_bytes=index_bytes,
            load=load,
        )
    finally:
        await redis.aclose()


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="a smoke run")
    args = parser.parse_args()
    plan = QUICK if args.quick else FULL
    logs = Path(tempfile.mkdtemp(prefix="streampool-bench-submit-index-"))
    redis_server, url = system.start_redis(logs)
    try:
        command = shlex.join(["python", "-m", "bench.submit_index", *sys.argv[1:]])
        cost = asyncio.run(measure(system.bench_settings(url), plan, command))
    finally:
        redis_server.terminate()
        redis_server.wait()
    path = report.record(submit_index=cost)
    print("\n".join(report.submit_index_section(cost)))
    print(f"wrote the submit_index part of results.json and rendered {path}")


if __name__ == "__main__":
    main()
