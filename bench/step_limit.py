"""The step script's cost on a busy Redis: calls of a GPU worker's size sent back to back.

A fleet level's Redis is mostly idle on this kind of machine (its calls come a few to a few dozen
a second), and an idle core's caches are someone else's by the next call: measured that way, a
job's step costs Redis about twice what it costs once Redis is busy, as it is at the load the
capacity model sizes it for (70 % of a core). `redis-benchmark`'s limits are taken busy; this
takes the step the same way, so that the two compare: the real step script (`Transitions`), every
job's lease checked (a cancel asked for rides on it) and one delta appended a job to its stream, the
calls made before the window and then sent in pipelines of `PIPELINE` so that Redis never waits for
them.

    python -m bench.step_limit [--jobs 256] [--calls 300] [--redis-url URL]
"""

from __future__ import annotations

import argparse
import uuid

import redis
import redis.asyncio as aioredis

from bench.limit_figures import Limit
from bench.redis_probe import Probe, snapshot
from shared.events import DeltaEvent
from shared.keys import Keys
from shared.lifecycle import scripts
from shared.lifecycle.planes import Lifecycle, OneRedis
from shared.lifecycle.transitions import JobStep, Transitions

JOBS = 256  # a GPU worker's running jobs: one call a step carries them all
CALLS = 300
PIPELINE = 8
WORKER = "step-limit-worker"
MAXLEN = 100_000  # a cap no job here reaches: no trimming, as at nearly every step
LIFETIME_SECONDS = 600  # of the keys made here, should the run not get to delete them


def _jobs(client: redis.Redis, keys: Keys, count: int) -> list[str]:
    """Jobs held by `WORKER` as a worker's started jobs stand: a lease, a record, a stream with an event
    (the step reads only the lease and the stream; the record stands, as after a start, for the
    keyspace the step's lookups meet)."""
    job_ids = [f"step-limit-{uuid.uuid4().hex[:12]}" for _ in range(count)]
    with client.pipeline(transaction=False) as pipe:
        for job_id in job_ids:
            pipe.set(keys.lease(job_id), WORKER, ex=LIFETIME_SECONDS)
            pipe.hset(keys.job(job_id), mapping={"status": "running", "owner": "-"})
            pipe.expire(keys.job(job_id), LIFETIME_SECONDS)
            pipe.xadd(keys.stream(job_id), {"type": "status", "data": "{}", "at": "0"}, id="0-1")
            pipe.expire(keys.stream(job_id), LIFETIME_SECONDS)
        pipe.execute()
    return job_ids


def _calls(transitions: Transitions, job_ids: list[str], calls: int) -> list[tuple[object, ...]]:
    """`calls` step calls of every job, a delta each, seqs 1 on: the commands a worker would send."""
    return [
        transitions.step_command(
            worker_id=WORKER,
            steps=[
                JobStep(job_id, [DeltaEvent(seq=seq, text=" token", token_ids=[0])]) for job_id in job_ids
            ],
        )
        for seq in range(1, calls + 1)
    ]


def measure(probe: Probe, prefix: str, jobs: int = JOBS, calls: int = CALLS) -> Limit:
    """Redis CPU per job-step of `calls` step calls of `jobs` jobs each, sent back to back; the keys
    made are deleted after."""
    client = probe.client
    keys = Keys(f"{prefix}:step-limit")
    job_ids = _jobs(client, keys, jobs)
    unconnected = aioredis.Redis()  # `Transitions` only builds the commands here
    lifecycle = Lifecycle(maxlen=MAXLEN, retention_seconds=0, lifetime_seconds=0)
    commands = _calls(
        Transitions(unconnected, keys, lifecycle, OneRedis(unconnected, keys, lifecycle)), job_ids, calls
    )
    client.script_load(scripts.STEP.source)
    try:
        before = snapshot(client)
        for start in range(0, calls, PIPELINE):
            with client.pipeline(transaction=False) as pipe:
                for command in commands[start : start + PIPELINE]:
                    pipe.execute_command(*command)  # type: ignore[no-untyped-call]
                for answers in pipe.execute():
                    if any(answer != "go" for answer in answers):
                        raise RuntimeError(f"a step was not taken: {answers[:3]}")
        after = snapshot(client)
    finally:
        for job_id in job_ids:
            client.delete(keys.lease(job_id), keys.job(job_id), keys.stream(job_id))
    taken = after.taken - before.taken
    return Limit(
        f"step script, {jobs} jobs a call (per job-step)",
        PIPELINE,
        jobs * calls,
        jobs * calls / taken,
        probe.busy(before, after),
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=JOBS)
    parser.add_argument("--calls", type=int, default=CALLS)
    parser.add_argument("--redis-url", default="redis://127.0.0.1:6379/0")
    args = parser.parse_args()
    probe = Probe(redis.Redis.from_url(args.redis_url, decode_responses=True))
    probe.measure_idle()
    limit = measure(probe, f"spbench-{uuid.uuid4().hex[:8]}", args.jobs, args.calls)
    print(
        f"{limit.name}: {limit.per_second:,.0f} job-steps/s, {limit.redis_us:.2f} µs of Redis CPU a job-step"
    )


if __name__ == "__main__":
    main()
