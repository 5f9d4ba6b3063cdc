"""Fair sharing among tenants: what start-time fair queuing over the tenants' shares of a model's queue
(`shared/lifecycle/claim.lua`) costs beside the single queue a deployment without tenants has.

End to end, with one real worker: tiny jobs (max_tokens 1) queued by `JobStore.submit` round-robin over
1, 10 and 100 tenants, and with no tenant at all (every job then waits in the default share, as a
deployment without tenants has it). A burst is submitted while the worker's process is held (SIGSTOP),
so that the whole burst waits in the queue when it resumes: the rate measured is the worker draining a
backlog, not the submitter's pace. Then pickup latency of an idle system, jobs one at a time as
`pickup.py` sends them.

The scheduler alone, without the engine: claims of one job each, timed by Redis itself (INFO
commandstats, EVALSHA), of the claim script and of the claim script before fair sharing
(`fifo_claim.lua`), on the same queued jobs.

`python -m bench.fair_share [--quick]` runs this phase alone, with a gateway, a worker and a private
redis-server of its own, and puts its figures into bench/results.json (`fair_share`, the other parts kept
as they are), from which RESULTS.md is rendered again (section 8 and its target: `report.record`).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import shlex
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Iterator
from datetime import datetime, timezone
from pathlib import Path

import psutil
import redis.asyncio as aioredis
import uvloop

from bench import fair_share_report, pickup, report, system
from bench.fair_share_figures import (
    NO_TENANT,
    TENANT_COUNTS,
    ClaimCost,
    FairPlan,
    FairShare,
    TenantRun,
    Timing,
)
from bench.stats import percentile
from bench.workload import request
from shared.config import Settings
from shared.jobstore import JobStore
from shared.keys import Keys
from shared.lifecycle import scripts
from shared.lifecycle.claims import claim
from shared.tenants import Tenant

DRAIN_TIMEOUT_SECONDS = 300
IN_PROGRESS_MS = 600_000  # the claim-cost runs' marks and claims: they must outlast the run
HERE = Path(__file__).resolve().parent
FIFO_CLAIM: scripts.LuaScript[list[object]] = scripts.LuaScript(
    "fifo_claim", (HERE / "fifo_claim.lua").read_text()
)


FULL = FairPlan(burst_jobs=300, rounds=5, pickup_jobs=100, claims=2000)
QUICK = FairPlan(burst_jobs=100, rounds=1, pickup_jobs=20, claims=300)


def steps(plan: FairPlan) -> int:
    """The progress steps of one run: each burst (the warm-up too), each pickup job, each claim-cost run."""
    return 1 + len(TENANT_COUNTS) * (plan.rounds + plan.pickup_jobs + 1)


def read_limit(settings: Settings) -> int:
    """The worker's `read_limit` of its claims: arq's default, which the worker keeps."""
    return max(settings.worker_max_jobs * 5, 100)


def shares(tenants: int) -> list[Tenant | None]:
    """The tenants jobs are submitted round-robin over: none at all for the single queue."""
    return [None] if tenants == NO_TENANT else [Tenant(f"t{number}") for number in range(tenants)]


def submitter(store: JobStore, model: str, tenants: int) -> pickup.Submit:
    """Submits the `n`-th tiny job of `model` in the share of the `n mod tenants`-th tenant."""
    among = shares(tenants)

    async def submit(number: int) -> str:
        job = request(number, max_tokens=1)
        tenant = among[number % len(among)]
        return (await store.submit(job, model=model, max_queued=0, tenant=tenant)).job_id

    return submit


@contextlib.contextmanager
def held(worker: psutil.Process) -> Iterator[None]:
    """The worker's process stopped (its engine core runs on, idle): it takes nothing until resumed."""
    worker.suspend()
    try:
        yield
    finally:
        worker.resume()


async def drained(store: JobStore, model: str) -> None:
    """Until the model's queue is empty and no job runs."""
    queue, running = store.keys.model(model).queue, store.keys.running
    async with asyncio.timeout(DRAIN_TIMEOUT_SECONDS):
        while await store.redis.zcard(queue) or await store.redis.scard(running):  # type: ignore[misc]
            await asyncio.sleep(0.05)


async def burst(store: JobStore, model: str, worker: psutil.Process, tenants: int, jobs: int) -> list[float]:
    """When the worker started each of `jobs` tiny jobs queued while it was held (epoch seconds)."""
    submit = submitter(store, model, tenants)
    with held(worker):
        ids = [await submit(number) for number in range(jobs)]
    await drained(store, model)
    started = [(await store.record(job_id)).started_at for job_id in ids]
    if None in started:
        raise RuntimeError(f"{started.count(None)} of the burst's jobs never started")
    return [moment.timestamp() for moment in started if moment is not None]


async def _evalsha(redis: aioredis.Redis) -> tuple[int, int]:
    """Calls and microseconds of EVALSHA so far, as Redis counts them."""
    stats = (await redis.info("commandstats")).get("cmdstat_evalsha", {"calls": 0, "usec": 0})
    return int(stats["calls"]), int(stats["usec"])


async def timed_claims(
    redis: aioredis.Redis, claim_one: Callable[[], Awaitable[str]], queue: str, claims: int
) -> Timing:
    """`claims` claims of one job each; each claimed job then leaves `queue`, as the worker's start
    script takes it out."""
    calls, usec = await _evalsha(redis)
    trips = []
    for _ in range(claims):
        began = time.perf_counter()
        job_id = await claim_one()
        trips.append(time.perf_counter() - began)
        await redis.zrem(queue, job_id)
    calls_after, usec_after = await _evalsha(redis)
    return Timing((usec_after - usec) / (calls_after - calls), percentile(trips, 50) * 1e6)


async def claim_cost(store: JobStore, tenants: int, claims: int, limit: int) -> ClaimCost:
    """`claims` jobs queued across `tenants` (on a model no worker serves), claimed one per call by the
    claim script, and from copies of the same queue by the script before fair sharing."""
    name = f"fair-share-claims-{tenants}"
    model = store.keys.model(name)
    submit = submitter(store, name, tenants)
    for number in range(claims):
        await submit(number)
    marks = f"{store.keys.prefix}:fair-share-claims:in-progress:"  # under the run's prefix: deleted with it
    for script in (FIFO_CLAIM, scripts.CLAIM):
        await store.redis.script_load(script.source)

    async def fifo(reading: int) -> Timing:
        """The script before fair sharing, reading up to `reading` jobs of a copy of the queue."""
        queue = f"{model.root}:fifo-queue:{reading}"
        await store.redis.copy(model.queue, queue)

        async def claim_one() -> str:
            now_ms = int(time.time() * 1000)
            args = [now_ms, IN_PROGRESS_MS, f"{marks}fifo-{reading}:", reading, 1]
            return str((await FIFO_CLAIM(store.redis, [queue], args))[0])

        return await timed_claims(store.redis, claim_one, queue, claims)

    async def fair() -> str:
        ((job_id, _),) = await claim(
            store.redis,
            keys=store.keys,
            model=model,
            worker_id="fair-share-bench",
            lease_seconds=IN_PROGRESS_MS / 1000,
            read_limit=limit,
            wanted=1,
        )
        return job_id

    before, head = await fifo(limit), await fifo(1)
    return ClaimCost(
        tenants, claims, before, head, await timed_claims(store.redis, fair, model.queue, claims)
    )


async def measure(
    store: JobStore,
    settings: Settings,
    worker: psutil.Process,
    plan: FairPlan,
    command: str,
    on_done: Callable[[], None],
) -> FairShare:
    """The whole phase, against the running worker `worker` (one, idle) serving `settings.model_name`."""
    model = settings.model_name
    measured = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    results = FairShare(command, measured, plan, read_limit(settings), settings.worker_max_jobs)
    results.runs = runs = [TenantRun(count) for count in TENANT_COUNTS]
    await burst(store, model, worker, NO_TENANT, plan.burst_jobs)  # warm-up: the first burst is slower
    on_done()
    for round_ in range(plan.rounds):  # each round begins with the next count, so none is always first
        for run in runs[round_ % len(runs) :] + runs[: round_ % len(runs)]:
            started = await burst(store, model, worker, run.tenants, plan.burst_jobs)
            run.add_burst(started, results.max_jobs)
            on_done()
    for run in results.runs:
        run.pickup = await pickup.measure(
            submitter(store, model, run.tenants), store, plan.pickup_jobs, on_done
        )
    for count in TENANT_COUNTS:
        results.claims.append(await claim_cost(store, count, plan.claims, results.read_limit))
        on_done()
    return results


async def _alone(settings: Settings, worker: psutil.Process, plan: FairPlan, command: str) -> FairShare:
    redis = aioredis.Redis.from_url(settings.redis_url, decode_responses=True)
    store = JobStore(redis, Keys(settings.key_prefix), settings)
    try:
        return await measure(store, settings, worker, plan, command, lambda: None)
    finally:
        await redis.aclose()


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="a smoke run")
    parser.add_argument("--redis-url", help="use this Redis instead of a private redis-server")
    args = parser.parse_args()
    plan = QUICK if args.quick else FULL
    logs = Path(tempfile.mkdtemp(prefix="streampool-bench-fair-share-"))
    redis_server, url = (None, args.redis_url) if args.redis_url else system.start_redis(logs)
    settings = system.bench_settings(url)
    children: list[system.Child] = []
    try:
        print(f"waiting for the gateway and the worker's engine (logs: {logs})")
        system.start_system(settings, logs, redis_server, children)
        print("measuring")
        results = uvloop.run(
            _alone(
                settings,
                children[1].handle,
                plan,
                shlex.join(["python", "-m", "bench.fair_share", *sys.argv[1:]]),
            )
        )
    finally:
        system.tear_down(children, url, settings.key_prefix, redis_server)
    path = report.record(fair_share=results)
    print("\n".join(fair_share_report.section(results)))
    print(f"wrote the fair_share part of results.json and rendered {path}")


if __name__ == "__main__":
    main()
