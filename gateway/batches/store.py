"""Batches' records in Redis (`Keys.batch`): made, read, listed for their owner, and moved on by the one
script that changes a batch's status (`batch_move.lua`), whoever moves it: the gateway that drives
it, or any gateway its cancel comes to."""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass
from typing import Any

import redis.asyncio as aioredis

from gateway.files.store import page
from shared.batches import (
    BATCH_ID_PREFIX,
    ENDED,
    BatchCreate,
    BatchError,
    BatchErrors,
    BatchObject,
    RequestCounts,
)
from shared.config import GatewaySettings
from shared.errors import JobNotFound, RateLimited
from shared.keys import Keys
from shared.lifecycle import scripts
from shared.lifecycle.arguments import BatchCreateArgs, BatchMoveArgs
from shared.redis_client import redis_errors

BATCH_ID_LENGTH = len(BATCH_ID_PREFIX) + 32
MAX_ERRORS = 100  # a failed batch lists at most this many of its lines' errors
RUNNING_RETRY_SECONDS = 60  # a batch refused for the running ones: a batch takes minutes to end
TIMES = (
    "in_progress_at",
    "finalizing_at",
    "completed_at",
    "failed_at",
    "expired_at",
    "cancelling_at",
    "cancelled_at",
)
RENEW = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('PEXPIRE', KEYS[1], ARGV[2]) end
return 0
"""
"""A lease kept by its holder alone (a lapsed one is another's to take)."""


@dataclass(frozen=True)
class Progress:
    """How far a batch has come: its lines, those handled (submitted, or refused by admission: `fed`,
    ending at byte `fed_offset` of its input), its jobs ended, and the lines admission refused."""

    total: int
    fed: int
    fed_offset: int
    completed: int
    failed: int
    refused: int

    @property
    def in_flight(self) -> int:
        """The batch's jobs queued or running now."""
        return self.fed - self.refused - self.completed - self.failed


class Batches:
    """Every batch's record."""

    def __init__(self, redis: aioredis.Redis, keys: Keys, settings: GatewaySettings) -> None:
        self.redis = redis
        self.keys = keys
        self.retention_seconds = settings.retention_seconds
        self.max_of_key = settings.batch_max_running_per_key
        self.max_of_tenant = settings.batch_max_running_per_tenant
        self._renew = redis.register_script(RENEW)

    async def create(
        self,
        created: BatchCreate,
        owner: str,
        tenant: str | None,
        window_seconds: int,
        webhook: dict[str, str],
    ) -> BatchObject:
        """A new batch, `validating`, among the active ones (a driver takes it up); `webhook`: the
        annotations of its webhook (`WebhookTargets.annotations`), none for none. `RateLimited` (nothing
        written) when the key, or its `tenant`, runs as many batches as it may."""
        batch_id = BATCH_ID_PREFIX + uuid.uuid4().hex
        now = time.time()
        fields = {
            "id": batch_id,
            "owner": owner,
            "status": "validating",
            "endpoint": created.endpoint,
            "input_file_id": created.input_file_id,
            "completion_window": created.completion_window,
            "created_at": int(now),
            "expires_at": int(now) + window_seconds,
            "metadata": json.dumps(created.metadata) if created.metadata is not None else "",
            "total": 0,
            "completed": 0,
            "failed": 0,
            "fed": 0,
            "fed_offset": 0,
            **{f"annotation:{name}": value for name, value in webhook.items()},
        }
        args: BatchCreateArgs = {
            "id": batch_id,
            "fields": {name: str(value) for name, value in fields.items()},
            "score": int(now * 1000),
            "max_of_key": self.max_of_key,
            "max_of_tenant": self.max_of_tenant,
        }
        batch_keys = [
            self.keys.batch(batch_id),
            self.keys.batches(owner),
            self.keys.batches_active,
            self.keys.batches_running(f"key:{owner}"),
            self.keys.batches_running(f"tenant:{tenant}") if tenant is not None else "",
        ]
        with redis_errors():
            outcome, *refusal = await scripts.BATCH_CREATE(self.redis, batch_keys, args)
        if outcome == "too_many":
            scope, running, most = refusal
            setting = f"batch_max_running_per_{scope}"
            raise RateLimited(
                f"this {'API key' if scope == 'key' else 'tenant'} runs {running} batches, the most it may "
                f"({setting}: {most}); another may be created once one ends",
                limit=setting,
                retry_after=RUNNING_RETRY_SECONDS,
            )
        return await self.get(batch_id, owner)

    async def record(self, batch_id: str) -> dict[str, str]:
        """The batch's record as Redis holds it; `JobNotFound` if there is none."""
        if not batch_id.startswith(BATCH_ID_PREFIX) or len(batch_id) > BATCH_ID_LENGTH:
            raise JobNotFound(f"no batch {batch_id}")
        with redis_errors():
            fields: dict[str, str] = await self.redis.hgetall(self.keys.batch(batch_id))  # type: ignore[misc]
        if not fields:
            raise JobNotFound(f"no batch {batch_id}")
        return fields

    async def get(self, batch_id: str, owner: str) -> BatchObject:
        """The owner's batch (`JobNotFound` for another owner's: it cannot tell the batch exists)."""
        fields = await self.record(batch_id)
        if fields.get("owner") != owner:
            raise JobNotFound(f"no batch {batch_id}")
        with redis_errors():
            refused = await self.redis.hlen(self.keys.batch_refusals(batch_id))  # type: ignore[misc]
        return batch_object(fields, refused)

    async def of_owner(self, owner: str, after: str | None, limit: int) -> tuple[list[BatchObject], bool]:
        """The owner's batches after `after`, newest first, at most `limit`, and whether more follow."""
        batches: list[BatchObject] = []
        for batch_id in await page(self.redis, self.keys.batches(owner), after, limit + 1, ascending=False):
            try:
                batches.append(await self.get(batch_id, owner))
            except JobNotFound:  # ended past its retention
                continue
        return batches[:limit], len(batches) > limit

    async def progress(self, batch_id: str) -> Progress:
        with redis_errors():
            async with self.redis.pipeline(transaction=False) as pipe:
                pipe.hmget(self.keys.batch(batch_id), ["total", "fed", "fed_offset", "completed", "failed"])
                pipe.hlen(self.keys.batch_refusals(batch_id))
                (total, fed, offset, completed, failed), refused = await pipe.execute()
        return Progress(
            int(total or 0), int(fed or 0), int(offset or 0), int(completed or 0), int(failed or 0), refused
        )

    async def advance(self, batch_id: str, fed: int, fed_offset: int) -> None:
        """Record how far the feeding has come, whatever the batch's status (a cancel that came meanwhile
        cancels the jobs of the lines counted here)."""
        with redis_errors():
            await self.redis.hset(self.keys.batch(batch_id), mapping={"fed": fed, "fed_offset": fed_offset})  # type: ignore[misc]

    async def refuse(self, batch_id: str, line: int, status: int, body: dict[str, Any]) -> None:
        """Keep a line admission refused as its error file entry: its status and OpenAI's error body."""
        refusal = json.dumps({"status_code": status, "body": body})
        with redis_errors():
            await self.redis.hset(self.keys.batch_refusals(batch_id), str(line), refusal)  # type: ignore[misc]

    async def move(self, batch_id: str, allowed: tuple[str, ...], to: str, **fields: Any) -> bool:
        """Move the batch from one of the `allowed` states to `to`, with `fields`, in one step (a batch
        that ends is announced to its webhook in the same step); False if it was in none of them."""
        keys = self.keys
        args: BatchMoveArgs = {
            "id": batch_id,
            "allowed": list(allowed),
            "to": to,
            "fields": {name: str(value) for name, value in fields.items()},
            "ends": to in ENDED,
            "retention": self.retention_seconds,
        }
        if to in ENDED:
            args["fields"] |= {"finished_at": str(time.time())}
        batch_keys = [
            keys.batch(batch_id),
            keys.batch_refusals(batch_id),
            keys.batches_active,
            keys.webhooks,
            keys.webhook(batch_id),
            keys.batch_ended(batch_id),
        ]
        with redis_errors():
            outcome, *_ = await scripts.BATCH_MOVE(self.redis, batch_keys, args)
        return bool(outcome == "moved")

    async def active(self) -> list[str]:
        """The batches not yet ended."""
        with redis_errors():
            active: list[str] = await self.redis.zrange(self.keys.batches_active, 0, -1)
        return active

    async def take(self, batch_id: str, holder: str, seconds: float) -> bool:
        """The batch's lease for `holder`, if no one holds it."""
        with redis_errors():
            return bool(
                await self.redis.set(self.keys.batch_lease(batch_id), holder, nx=True, px=int(seconds * 1000))
            )

    async def keep(self, batch_id: str, holder: str, seconds: float) -> bool:
        """Renew `holder`'s lease; False if it is no longer `holder`'s."""
        with redis_errors():
            return bool(
                await self._renew(keys=[self.keys.batch_lease(batch_id)], args=[holder, int(seconds * 1000)])
            )

    async def let_go(self, batch_id: str, holder: str) -> None:
        """Give the lease up (if still `holder`'s), for another gateway to take at once."""
        with redis_errors():
            await self._renew(keys=[self.keys.batch_lease(batch_id)], args=[holder, 1])


def batch_object(fields: dict[str, str], refused: int) -> BatchObject:
    """The Batch object of a record; `refused`: its lines admission refused (counted as failed)."""
    errors = json.loads(fields["errors"]) if fields.get("errors") else None
    return BatchObject(
        id=fields["id"],
        endpoint=fields["endpoint"],
        input_file_id=fields["input_file_id"],
        completion_window=fields["completion_window"],
        status=fields["status"],
        created_at=int(fields["created_at"]),
        expires_at=int(fields["expires_at"]),
        output_file_id=fields.get("output_file_id") or None,
        error_file_id=fields.get("error_file_id") or None,
        errors=BatchErrors(data=[BatchError.model_validate(error) for error in errors]) if errors else None,
        request_counts=RequestCounts(
            total=int(fields.get("total", 0)),
            completed=int(fields.get("completed", 0)),
            failed=int(fields.get("failed", 0)) + refused + int(fields.get("unrun", 0)),
        ),
        metadata=json.loads(fields["metadata"]) if fields.get("metadata") else None,
        **{name: int(float(fields[name])) for name in TIMES if fields.get(name)},
    )
