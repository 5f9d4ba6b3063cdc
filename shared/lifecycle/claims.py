"""A worker's side of its model's queue, beside the lifecycle's transitions: its claims of queued jobs
(`claim.lua`: fair among tenants, by tokens, preferring the prefixes its cache holds), what it tells of
its cache (`advertise.lua`), and a claim let go of (`unclaim.lua`). Functions, not `Transitions`
methods: the worker's queue loop runs them on its own connections."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import redis.asyncio as aioredis

from shared.keys import Keys, ModelKeys
from shared.lifecycle import scripts
from shared.lifecycle.arguments import AdvertiseArgs, ClaimArgs, UnclaimArgs
from shared.scheduling import MAX_PREFIX_BLOCKS

PREFERRED_SCALE = 2 * MAX_PREFIX_BLOCKS  # past the blocks a job's prefix can hold (`PreferredArgs`)
# A model's prefix map outlives a day without a new prompt run, no more.
PREFIX_INDEX_TTL_MS = 24 * 3600 * 1000


@dataclass(frozen=True)
class Affinity:
    """How a worker's claims follow the prefixes its cache holds (`claim.lua`): `window` head jobs of
    a share looked at, a job left `wait_seconds` to the worker holding its prefix (or to a less loaded
    one), a worker's load counted for `stale_seconds` after its last claim, and its advertised blocks
    for `blocks_ttl_seconds` (`advertise`)."""

    window: int
    wait_seconds: float
    stale_seconds: float
    blocks_ttl_seconds: float


async def claim(
    redis: aioredis.Redis,
    *,
    keys: Keys,
    model: ModelKeys,
    worker_id: str,
    lease_seconds: float,
    read_limit: int,
    wanted: int,
    batch_wanted: int = 0,
    charges: Sequence[tuple[str, int]] = (),
    affinity: Affinity | None = None,
    running: int = 0,
) -> list[tuple[str, int]]:
    """Up to `wanted` of `model`'s queued jobs that no other worker has taken, picked fairly among
    the tenants' shares (`claim.lua`), each claimed for `worker_id`: (id, submission ms) pairs. Of
    them at most `batch_wanted` are batches' jobs, and only once no interactive job waits.
    `charges`: (job id, output tokens) of the jobs this worker ended since its last claim;
    `affinity`: prefer the jobs whose prefix this worker's cache holds (`running`: its jobs now).
    """
    lease_prefix, lease_suffix = keys.lease_affixes
    args: ClaimArgs = {
        "worker": worker_id,
        "lease_ms": int(lease_seconds * 1000),
        "lease_prefix": lease_prefix,
        "lease_suffix": lease_suffix,
        "share_prefix": model.share_queue_prefix,
        "job_prefix": keys.job(""),
        "read_limit": read_limit,
        "wanted": wanted,
        "batch_wanted": batch_wanted,
        "charges": list(charges),
        "affinity": None
        if affinity is None
        else {
            "preferred_prefix": model.preferred_prefix,
            "scale": PREFERRED_SCALE,
            "running": running,
            "window": affinity.window,
            "wait_ms": int(affinity.wait_seconds * 1000),
            "stale_ms": int(affinity.stale_seconds * 1000),
            "blocks_ttl_ms": int(affinity.blocks_ttl_seconds * 1000),
        },
    }
    keys_used = [
        model.queue,
        model.share_tenants,
        model.batch_share_tenants,
        model.share_state,
        model.worker_loads,
        keys.workers,
        model.worker_blocks(worker_id),
    ]
    answer = await scripts.CLAIM(redis, keys_used, args)
    return [(job_id, int(float(score))) for job_id, score in zip(answer[::2], answer[1::2], strict=True)]


async def advertise(
    redis: aioredis.Redis,
    *,
    model: ModelKeys,
    worker_id: str,
    blocks: Sequence[str],
    capacity: int,
    ttl_seconds: float,
) -> None:
    """Tell that `worker_id`'s cache now holds `blocks`, a prompt's leading block hashes, keeping at
    most `capacity` of its blocks advertised (`advertise.lua`); they lapse `ttl_seconds` after its
    last claim or advertisement."""
    args: AdvertiseArgs = {
        "worker": worker_id,
        "blocks": list(blocks),
        "capacity": capacity,
        "ttl_ms": int(ttl_seconds * 1000),
        "index_ttl_ms": PREFIX_INDEX_TTL_MS,
    }
    await scripts.ADVERTISE(redis, [model.prefix_blocks, model.worker_blocks(worker_id)], args)


async def unclaim(
    redis: aioredis.Redis, *, keys: Keys, model: ModelKeys, job_id: str, worker_id: str
) -> None:
    """Let go of a job `worker_id` claimed and will not start (`unclaim.lua`), waking `model`'s workers."""
    args: UnclaimArgs = {"worker": worker_id, "wakeup": model.wakeup}
    await scripts.UNCLAIM(redis, [keys.lease(job_id)], args)
