"""A stand-in for workers, used only by the benchmark: real job records (JobStore submit + start, so the
gateway sees running jobs) whose streams get delta events at a set rate, appended with XADD as the
worker's step script appends them (id `<seq>-1`, fields type/data/at, data a DeltaEvent JSON), one
write of them per tick.
Each delta's `text` is its send time (time.time()), from which a client computes the relay lag."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass

import hiredis
import redis.asyncio as aioredis

from shared.events import DeltaEvent, DoneEvent, JobState, Usage
from shared.jobstore import JobStore, Outcome
from shared.requests import JobRequest

TICK_SECONDS = 0.01
CREATE_BATCH = 200
WORKER_ID = "bench-synthetic-producer"
MODEL = "synthetic"
FIRST_SEQ = 2  # as the worker: 0 is `queued`, 1 is `running`
LEASE_SECONDS = 3600.0  # it renews no lease (no heartbeat): its jobs' leases outlast a level


@dataclass
class Production:
    """What one run appended, and how closely it kept to its schedule."""

    events: int
    seconds: float
    worst_tick_late: float


class SyntheticProducer:
    def __init__(self, redis: aioredis.Redis, store: JobStore) -> None:
        self.redis = redis
        self.store = store
        self.maxlen = store.settings.stream_maxlen
        self.seq: dict[str, int] = {}

    async def create(self, count: int) -> list[str]:
        """`count` running jobs: submitted and started through JobStore, as gateway and worker would."""
        request = JobRequest(prompt="synthetic", max_tokens=1)
        job_ids: list[str] = []
        for start in range(0, count, CREATE_BATCH):
            size = min(CREATE_BATCH, count - start)
            submissions = await asyncio.gather(
                *(self.store.submit(request, model=MODEL, max_queued=0) for _ in range(size))
            )
            ids = [s.job_id for s in submissions]
            await asyncio.gather(
                *(self.store.start(job_id, WORKER_ID, MODEL, lease_seconds=LEASE_SECONDS) for job_id in ids)
            )
            job_ids += ids
        self.seq.update({job_id: FIRST_SEQ for job_id in job_ids})
        return job_ids

    def delta(self, job_id: str, sent: float) -> DeltaEvent:
        """The job's next delta, one token, its text the time `sent`."""
        seq = self.seq[job_id]
        self.seq[job_id] = seq + 1
        return DeltaEvent(seq=seq, text=repr(sent), token_ids=[0])

    async def produce(
        self, job_ids: list[str], rate: float, seconds: float, tick_seconds: float = TICK_SECONDS
    ) -> Production:
        """Every stream gets `rate` events a second: each tick serves the streams whose turn it is (a
        tick's write is a burst, as one worker's step is).

        A tick's XADDs are packed by hiredis and sent in one write, their replies read after: redis-py's
        pipeline packs each command in Python, which cost the producer three times the CPU, taken from the
        cores the gateway and Redis are measured on.
        """
        groups = max(1, round(1 / (rate * tick_seconds)))
        streams = {job_id: self.store.keys.stream(job_id) for job_id in job_ids}
        connection = await self.redis.connection_pool.get_connection("XADD")
        began = time.monotonic()
        events, tick, worst_late = 0, 0, 0.0
        try:
            while (due := began + tick * tick_seconds) < began + seconds:
                late = time.monotonic() - due
                if late < 0:
                    await asyncio.sleep(-late)
                worst_late = max(worst_late, late)
                sent = time.time()
                due_now = job_ids[tick % groups :: groups]
                at = str(int(sent * 1000))
                deltas = [(job_id, self.delta(job_id, sent)) for job_id in due_now]
                commands = [
                    hiredis.pack_command(  # its stub types the command as a 1-tuple
                        ("XADD", streams[job_id], "MAXLEN", "~", self.maxlen, f"{delta.seq}-1")  # type: ignore[arg-type]
                        + ("type", "delta", "data", delta.model_dump_json(), "at", at)
                    )
                    for job_id, delta in deltas
                ]
                await connection.send_packed_command(b"".join(commands))
                for _ in commands:
                    await connection.read_response()
                events += len(commands)
                tick += 1
        finally:
            await self.redis.connection_pool.release(connection)
        return Production(events, time.monotonic() - began, worst_late)

    async def finish(self, job_ids: list[str]) -> None:
        """End every job with a terminal `done` event through JobStore's own finish script."""
        pipe = self.redis.pipeline(transaction=False)
        for job_id in job_ids:
            produced = self.seq[job_id] - FIRST_SEQ
            usage = Usage(prompt_tokens=1, completion_tokens=produced)
            done = DoneEvent(seq=self.seq[job_id], finish_reason="stop", usage=usage)
            outcome = Outcome(state=JobState.completed, text="", token_count=produced, usage=usage)
            pipe.execute_command(*self.store.finish_commands(job_id, WORKER_ID, [done], outcome).record)
        await pipe.execute()
