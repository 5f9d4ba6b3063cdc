"""Prefix-aware claiming against the real Redis (`claim.lua`, `advertise.lua`, `submit.lua`): a job
whose prefix a live worker holds goes to that worker, or to another once it has waited the bound; a
job held nowhere goes to the least loaded worker; a dead worker's blocks are dropped; the worker
holding the longest prefix is preferred, within the head priority; a worker's blocks stay within
its cache's size. Workers are ids with a heartbeat entry here: the subject is the scripts."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence

from shared.jobstore import JobStore
from shared.lifecycle.claims import Affinity, advertise
from shared.requests import JobRequest
from shared.scheduling import Placement, block_hashes
from tests.shared.transitions import claimed

MODEL = "smol"
BLOCK = 16
SYSTEM = list(range(1000, 1000 + 8 * BLOCK))  # a shared prefix of 8 blocks
AFFINITY = Affinity(window=16, wait_seconds=30.0, stale_seconds=30.0, blocks_ttl_seconds=30.0)


def blocks(token_ids: Sequence[int]) -> list[str]:
    return block_hashes(token_ids, BLOCK)


async def alive(store: JobStore, *workers: str, seconds: float = 30.0) -> None:
    """Heartbeats for `workers`, lasting `seconds` (negative: lapsed)."""
    expires = int((time.time() + seconds) * 1000)
    await store.redis.zadd(store.keys.workers, dict.fromkeys(workers, expires))


async def holds(store: JobStore, worker: str, token_ids: Sequence[int], capacity: int = 10_000) -> None:
    await advertise(
        store.redis,
        model=store.keys.model(MODEL),
        worker_id=worker,
        blocks=blocks(token_ids),
        capacity=capacity,
        ttl_seconds=30,
    )


async def submit(store: JobStore, token_ids: Sequence[int], priority: int = 0) -> str:
    job = JobRequest(prompt_token_ids=list(token_ids), max_tokens=1, priority=priority)
    placement = Placement(len(token_ids), tuple(blocks(token_ids)))
    return (await store.submit(job, model=MODEL, max_queued=0, placement=placement)).job_id


async def claims(
    store: JobStore, worker: str, *, running: int = 0, affinity: Affinity = AFFINITY
) -> list[str]:
    return await claimed(store, worker=worker, model=MODEL, affinity=affinity, running=running)


async def test_a_job_goes_to_the_live_worker_holding_its_prefix(store: JobStore) -> None:
    await alive(store, "w1", "w2")
    await holds(store, "w1", SYSTEM + [1, 2, 3])
    job = await submit(store, SYSTEM + list(range(40)))
    assert await store.redis.hmget(store.keys.job(job), "prefer", "prefer_blocks") == ["w1", "8"]
    assert await claims(store, "w2") == []  # left to w1
    assert await claims(store, "w1") == [job]


async def test_a_job_left_to_a_busy_worker_is_taken_by_another_within_the_bound(store: JobStore) -> None:
    await alive(store, "w1", "w2")
    await holds(store, "w1", SYSTEM)
    job = await submit(store, SYSTEM + [7] * BLOCK)
    bound = Affinity(window=16, wait_seconds=0.3, stale_seconds=30.0, blocks_ttl_seconds=30.0)
    assert await claims(store, "w2", affinity=bound) == []  # w1 is full: it claims nothing meanwhile
    await asyncio.sleep(0.35)
    assert await claims(store, "w2", affinity=bound) == [job]


async def test_a_dead_workers_blocks_are_dropped(store: JobStore) -> None:
    await alive(store, "w1", "w2")
    await holds(store, "w1", SYSTEM)
    held = store.keys.model(MODEL).worker_blocks("w1")
    assert 0 < await store.redis.pttl(held) <= 30_000  # its own set lapses with its claims
    await alive(store, "w1", seconds=-1)  # w1's heartbeat lapsed: it died
    index = store.keys.model(MODEL).prefix_blocks
    job = await submit(store, SYSTEM + list(range(BLOCK)))
    assert await store.redis.hget(store.keys.job(job), "prefer") is None
    assert await store.redis.hlen(index) < len(blocks(SYSTEM))  # the entries the lookup met are gone
    for end in range(1, len(SYSTEM) // BLOCK + 1):  # and those left send no job to it
        assert (
            await store.redis.hget(store.keys.job(await submit(store, SYSTEM[: end * BLOCK])), "prefer")
            is None
        )
    assert await claims(store, "w2") == [job]  # at once: nothing is left to a dead worker


async def test_the_longest_held_prefix_comes_first_then_jobs_held_nowhere(store: JobStore) -> None:
    await alive(store, "w1", "w2")
    await holds(store, "w1", SYSTEM)
    await holds(store, "w2", [5] * 4 * BLOCK)
    nowhere = await submit(store, [9] * 4 * BLOCK)
    short = await submit(store, SYSTEM[: 2 * BLOCK] + [8] * BLOCK)
    longest = await submit(store, SYSTEM + [8] * BLOCK)
    theirs = await submit(store, [5] * 5 * BLOCK)
    order = [await claims(store, "w1") for _ in range(4)]
    assert order == [[longest], [short], [nowhere], []]  # w2's job waits for w2
    assert await claims(store, "w2") == [theirs]


async def test_priority_comes_before_the_prefix(store: JobStore) -> None:
    await alive(store, "w1")
    await holds(store, "w1", SYSTEM)
    held = await submit(store, SYSTEM + [1] * BLOCK)
    urgent = await submit(store, [2] * 3 * BLOCK, priority=-1)
    assert [await claims(store, "w1") for _ in range(2)] == [[urgent], [held]]


async def test_a_job_held_nowhere_goes_to_the_least_loaded_worker(store: JobStore) -> None:
    await alive(store, "w1", "w2")
    assert await claims(store, "w1", running=5) == []  # each worker's last claim tells its load
    assert await claims(store, "w2", running=1) == []
    job = await submit(store, [3] * 3 * BLOCK)
    assert await claims(store, "w1", running=5) == []
    assert await claims(store, "w2", running=1) == [job]


async def test_a_workers_blocks_stay_within_its_cache(store: JobStore) -> None:
    await alive(store, "w1")
    first, second = [1] * 4 * BLOCK, [2] * 4 * BLOCK
    await holds(store, "w1", first, capacity=6)
    await holds(store, "w1", second, capacity=6)
    index = await store.redis.hgetall(store.keys.model(MODEL).prefix_blocks)
    # The first prompt's last two blocks went (least recently used, a prompt's later blocks first).
    assert [block in index for block in blocks(first)] == [True, True, False, False]
    assert all(block in index for block in blocks(second))
    assert await store.redis.zcard(store.keys.model(MODEL).worker_blocks("w1")) == 6
