"""What the console's snapshot reads, on the real Redis: each queue's depth, batch band and oldest wait,
and each worker's rates from the counters of its heartbeats."""

from __future__ import annotations

import time

from gateway.console import Rates, queue_rows
from shared.jobstore import JobStore
from shared.requests import JobRequest
from shared.workers import WorkerInfo

REQUEST = JobRequest(prompt="Hi", max_tokens=4)


async def test_a_queue_shows_its_depth_its_batch_band_and_its_oldest_wait(store: JobStore) -> None:
    submitted = time.time()
    await store.submit(REQUEST, model="smol", max_queued=0)
    for line in range(2):
        await store.submit(REQUEST, model="smol", max_queued=0, batch=f"batch_{line}")
    now = submitted + 5
    rows = await queue_rows(store.redis, store.keys, ["smol", "idle"], {"smol": 2}, now)
    idle, smol = rows  # by name
    assert (smol.model, smol.workers, smol.queued, smol.batch_queued) == ("smol", 2, 3, 2)
    assert smol.oldest_wait is not None and 4.5 < smol.oldest_wait < 5.01  # the queue scores by ms
    assert (idle.model, idle.workers, idle.queued, idle.batch_queued, idle.oldest_wait) == (
        "idle",
        0,
        0,
        0,
        None,
    )


def heartbeat(at: float, tokens: int, steps: int, worker_id: str = "w1") -> WorkerInfo:
    return WorkerInfo(
        worker_id=worker_id,
        model="smol",
        max_model_len=2048,
        running_jobs=1,
        engine_requests=1,
        generated_tokens=tokens,
        steps=steps,
        started_at=0,
        heartbeat_at=at,
        host="host",
        pid=1,
    )


def test_rates_are_two_heartbeats_difference_over_their_time_apart() -> None:
    rates = Rates()
    assert rates.update([heartbeat(10, 100, 50)]) == {}  # one heartbeat: no rate yet
    assert rates.update([heartbeat(10, 100, 50)]) == {}  # the same one read again
    assert rates.update([heartbeat(12, 300, 60)]) == {"w1": (100.0, 5.0)}
    assert rates.update([heartbeat(12, 300, 60)]) == {"w1": (100.0, 5.0)}  # kept until the next heartbeat
    assert rates.update([heartbeat(14, 300, 60), heartbeat(14, 0, 0, "w2")]) == {"w1": (0.0, 0.0)}
    assert rates.update([heartbeat(16, 10, 1, "w2")]) == {"w2": (5.0, 0.5)}  # w1 gone, and its rate
