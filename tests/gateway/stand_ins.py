"""What the engine-free gateway tests stand in for: a private redis-server (for figures that are
server-wide, such as INFO commandstats and memory), a worker's heartbeat, and a worker running a job
through the job store's own transitions."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import redis.asyncio as aioredis

from shared.events import CancelledEvent, DeltaEvent, DoneEvent, Event, JobState, Usage
from shared.jobstore import JobStore, Outcome
from shared.keys import Keys
from shared.lifecycle import scripts
from shared.lifecycle.transitions import JobStep
from shared.workers import WorkerInfo, announce
from tests.processes import Processes, free_port
from tests.shared.transitions import transitions

CARD_MODEL = "SmolLM2-135M-Instruct"  # the model card of the `model_card` fixture: the default model
CARD_CONTEXT = 2048
DELTAS = 5
WORKER = "stand-in-worker"


@contextmanager
def private_redis(folder: Path, *options: str) -> Iterator[str]:
    """A redis-server of this test's own (`options` added to its command line); its URL."""
    processes = Processes(folder)
    try:
        yield processes.start_redis("redis", free_port(), folder / "data", "--appendonly", "no", *options)
    finally:
        processes.stop_all()


async def heartbeat(
    redis: aioredis.Redis,
    keys: Keys,
    worker_id: str,
    model: str,
    *,
    ttl_ms: int = 60_000,
    dtype: str | None = None,
    running_jobs: int = 0,
    aliases: list[str] | None = None,
    adapters: list[str] | None = None,
    max_model_len: int = 512,
    max_chars_per_token: int | None = None,
) -> None:
    """A heartbeat as a live worker writes it (no job is ever run by this worker), saying it runs
    `running_jobs`."""
    now = time.time()
    info = WorkerInfo(
        worker_id=worker_id,
        model=model,
        aliases=aliases or [],
        adapters=adapters or [],
        max_model_len=max_model_len,
        max_chars_per_token=max_chars_per_token,
        dtype=dtype,
        running_jobs=running_jobs,
        engine_requests=0,
        started_at=now,
        heartbeat_at=now,
        host="test",
        pid=0,
    )
    await announce(redis, keys, info, ttl_ms)


class StandInWorker:
    """Runs one job as the worker would, event by event, through the job store's transitions (start,
    the step script, finish), as the worker's publisher sends them: a test decides when each event is
    written."""

    def __init__(self, store: JobStore, job_id: str) -> None:
        self.store, self.job_id = store, job_id

    async def start(self, model: str = "model") -> None:
        assert await self.store.start(self.job_id, WORKER, model, lease_seconds=60) is not None

    async def run_to_done(self, finish_reason: str = "length") -> None:
        """DELTAS deltas (seqs 2 on), then `done` for `finish_reason`."""
        redis = self.store.redis
        await redis.script_load(scripts.STEP.source)  # a fresh Redis has none; the worker loads it so
        for seq in range(2, 2 + DELTAS):
            delta = DeltaEvent(seq=seq, text=f"t{seq}", token_ids=[seq])
            await transitions(self.store, maxlen=1000).step(
                worker_id=WORKER, step=JobStep(self.job_id, [delta])
            )
        usage = Usage(prompt_tokens=1, completion_tokens=DELTAS)
        outcome = Outcome(JobState.completed, "", DELTAS, usage, finish_reason=finish_reason)
        await self._end(DoneEvent(seq=2 + DELTAS, finish_reason=finish_reason, usage=usage), outcome)

    async def end_cancelled(self) -> None:
        """`cancelled` right after `running`, as a worker that saw the cancel key ends the job."""
        usage = Usage(prompt_tokens=1, completion_tokens=0)
        await self._end(CancelledEvent(seq=2, usage=usage), Outcome(JobState.cancelled, "", 0, usage))

    async def _end(self, terminal: Event, outcome: Outcome) -> None:
        command = self.store.finish_commands(self.job_id, WORKER, [terminal], outcome).record
        await self.store.redis.execute_command(*command)
