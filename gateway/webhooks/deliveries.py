"""The webhooks stream and the delivery records, as a sender reads and writes them.

Every gateway's sender reads the stream through one consumer group: an entry goes to one sender,
stays pending with it until delivered or given up (then it is acknowledged and deleted in the same
step as its record says so), and a sender that stops touching its entries (its gateway is gone) has
them taken over by another (`XAUTOCLAIM`). Each entry held is also in its tenant's index
(`Keys.tenant_webhooks`), which bounds the tenant's deliveries under way and no other's.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timezone
from importlib.resources import files
from typing import Any

import redis.asyncio as aioredis
from redis.exceptions import ResponseError

from shared.errors import JobNotFound
from shared.keys import Keys
from shared.lifecycle.scripts import LuaScript
from shared.redis_client import redis_errors
from shared.webhooks import (
    DeliveryStatus,
    WebhookDelivery,
    WebhookEvent,
    WebhookEventData,
    event_id,
    event_type,
    subject_id,
)


def _script(name: str) -> LuaScript[list[Any]]:
    """This package's `<name>.lua`, which takes positional ARGV."""
    return LuaScript(name, files(__package__).joinpath(f"{name}.lua").read_text())


GROUP = "senders"
KEEP = _script("keep")
HOLD = _script("hold")
ATTEMPTED = _script("attempted")
MAX_ERROR_CHARS = 500
BATCH = 1000  # the most entries one script call keeps or gives up: Redis serves no one else meanwhile


@dataclass(frozen=True)
class Announcement:
    """One entry of the webhooks stream: an ended job's webhook, with all that delivering it needs."""

    entry_id: str
    job_id: str
    url: str
    api: str
    owner: str
    state: str  # a job's `JobState`, or a batch's end (`shared.batches.ENDED`)
    finish_reason: str | None
    ended_at: float

    @classmethod
    def of(cls, entry_id: str, fields: dict[str, str]) -> Announcement:
        """`KeyError` / `ValueError` for an entry that is not one (only `announce_end.lua` writes them)."""
        return cls(
            entry_id,
            fields["job"],
            fields["url"],
            fields["api"],
            fields["owner"],
            fields["state"],
            fields["finish_reason"] or None,
            float(fields["ended_at"]),
        )

    def event(self) -> WebhookEvent:
        return WebhookEvent(
            id=event_id(self.job_id),
            type=event_type(self.api, self.state, self.finish_reason),
            created_at=int(self.ended_at),
            data=WebhookEventData(id=subject_id(self.api, self.job_id)),
        )


@dataclass(frozen=True)
class Progress:
    """What the delivery record says of the attempts so far."""

    attempts: int
    next_attempt_at: float  # 0: at once


@dataclass(frozen=True)
class Holding:
    """What `Deliveries.hold` found: each entry's progress (None: not to hold, finished or gone), and the
    ids of the deliveries it gave up, past their tenants' bound."""

    progress: list[Progress | None]
    given_up: list[str]


def _mapping(fields: dict[str, Any]) -> dict[str, str]:
    """A record's fields as Redis keeps them (None: cleared), the error cut to `MAX_ERROR_CHARS`."""
    mapping = {name: "" if value is None else str(value) for name, value in fields.items()}
    if "last_error" in mapping:
        mapping["last_error"] = mapping["last_error"][:MAX_ERROR_CHARS]
    return mapping


def _time(value: str | None) -> datetime | None:
    return datetime.fromtimestamp(float(value), tz=timezone.utc) if value else None


class Deliveries:
    """The webhooks stream's consumer group, and the delivery records."""

    def __init__(self, redis: aioredis.Redis, keys: Keys, record_ttl_seconds: int) -> None:
        self.redis = redis
        self.keys = keys
        self.record_ttl_seconds = record_ttl_seconds

    async def join(self) -> bool:
        """Make the consumer group unless it exists; False while the stream does not (no job has had a
        webhook yet): the sender writes no key of its own, so a gateway without webhooks writes nothing."""
        with redis_errors():
            try:
                await self.redis.xgroup_create(self.keys.webhooks, GROUP, id="0")
            except ResponseError as exc:
                if str(exc).startswith("BUSYGROUP"):
                    return True
                if "requires the key to exist" in str(exc):
                    return False
                raise
        return True

    def _announcements(self, entries: list[Any]) -> list[Announcement | str]:
        """Each entry as an announcement, or its id alone when it is not one (to be dropped)."""
        read: list[Announcement | str] = []
        for entry_id, fields in entries:
            try:
                read.append(Announcement.of(entry_id, fields))
            except (KeyError, ValueError):
                read.append(entry_id)
        return read

    async def read_new(self, consumer: str, count: int, block_ms: int) -> list[Announcement | str]:
        """Entries no sender has had yet, waiting up to `block_ms` for one."""
        with redis_errors():
            answer = await self.redis.xreadgroup(
                GROUP, consumer, {self.keys.webhooks: ">"}, count=count, block=block_ms
            )
        return self._announcements(answer[0][1] if answer else [])

    async def take_over(
        self, consumer: str, idle_ms: int, count: int, cursor: str
    ) -> tuple[str, list[Announcement | str]]:
        """Entries pending with a sender that has not touched them for `idle_ms` (gone), from `cursor`;
        answers where the next call goes on."""
        with redis_errors():
            answer = await self.redis.xautoclaim(
                self.keys.webhooks, GROUP, consumer, idle_ms, start_id=cursor, count=count
            )
        return answer[0], self._announcements([entry for entry in answer[1] if entry[1] is not None])

    async def keep(self, consumer: str, entry_ids: list[str]) -> list[str]:
        """Reset the idle time of the entries `consumer` holds; answers those it no longer holds (another
        sender took them, or they were finished or given up meanwhile)."""
        lost: list[str] = []
        with redis_errors():
            for start in range(0, len(entry_ids), BATCH):
                batch = entry_ids[start : start + BATCH]
                lost += await KEEP(self.redis, [self.keys.webhooks], [GROUP, consumer, *batch])
        return lost

    async def hold(self, entries: list[tuple[Announcement, str]], max_pending: int, reason: str) -> Holding:
        """Each entry read, with its tenant: its delivery so far, and its place in the tenant's index;
        then each of those tenants' oldest deliveries beyond `max_pending` given up (at most `BATCH` a
        tenant a call), in one round trip (`hold.lua`)."""
        keys = [self.keys.webhooks]
        for announcement, tenant in entries:
            keys += [self.keys.webhook(announcement.job_id), self.keys.tenant_webhooks(tenant)]
        record_prefix, record_suffix = self.keys.webhook_affixes
        ids = [announcement.entry_id for announcement, _ in entries]
        with redis_errors():
            progress, given_up = await HOLD(
                self.redis, keys, [GROUP, max_pending, BATCH, reason, record_prefix, record_suffix, *ids]
            )
        return Holding(
            [Progress(int(so_far[0]), float(so_far[1] or 0)) if so_far else None for so_far in progress],
            given_up,
        )

    async def leave(self, consumer: str) -> None:
        """Remove `consumer` from the group if it holds nothing (what it holds would be lost with it).
        Where there is no group (no job has had a webhook), there is nothing to leave."""
        with redis_errors():
            try:
                pending = await self.redis.xpending_range(
                    self.keys.webhooks, GROUP, min="-", max="+", count=1, consumername=consumer
                )
                if not pending:
                    await self.redis.xgroup_delconsumer(self.keys.webhooks, GROUP, consumer)
            except ResponseError as exc:
                if not str(exc).startswith("NOGROUP"):
                    raise

    async def attempted(self, announcement: Announcement, fields: dict[str, Any]) -> None:
        """Record an attempt that failed; the entry stays pending, for the next. A delivery given up
        while the attempt was under way keeps the record its give-up wrote (`attempted.lua`)."""
        pairs = [part for field in _mapping(fields).items() for part in field]
        with redis_errors():
            await ATTEMPTED(
                self.redis, [self.keys.webhook(announcement.job_id)], [self.record_ttl_seconds, *pairs]
            )

    async def finished(self, announcement: Announcement, tenant: str, fields: dict[str, Any]) -> None:
        """Record the delivery's end (delivered or given up) and drop its entry, from its tenant's index
        too, in one step: once the record says delivered, no sender has the entry any more, so the
        event is never sent again."""
        with redis_errors():
            async with self.redis.pipeline(transaction=True) as pipe:
                self._record(pipe, announcement, fields)
                pipe.xack(self.keys.webhooks, GROUP, announcement.entry_id)
                pipe.xdel(self.keys.webhooks, announcement.entry_id)
                pipe.zrem(self.keys.tenant_webhooks(tenant), announcement.entry_id)
                await pipe.execute()

    async def drop(self, entry_id: str) -> None:
        """Acknowledge and delete an entry there is nothing to send for."""
        with redis_errors():
            async with self.redis.pipeline(transaction=True) as pipe:
                pipe.xack(self.keys.webhooks, GROUP, entry_id)
                pipe.xdel(self.keys.webhooks, entry_id)
                await pipe.execute()

    def _record(self, pipe: Any, announcement: Announcement, fields: dict[str, Any]) -> None:
        """Write the record's fields with a fresh TTL, which outlives the next wait."""
        key = self.keys.webhook(announcement.job_id)
        pipe.hset(key, mapping=_mapping(fields))
        pipe.expire(key, self.record_ttl_seconds)

    async def record(self, job_id: str, webhook_url: str | None) -> WebhookDelivery:
        """The job's delivery record, for its owner. A job with a webhook that has not ended has none yet;
        `JobNotFound` for a job without a webhook."""
        with redis_errors():
            fields = await self.redis.hgetall(self.keys.webhook(job_id))  # type: ignore[misc]
        if not fields:
            if webhook_url is None:
                raise JobNotFound(f"job {job_id} has no webhook")
            return WebhookDelivery(url=webhook_url)
        return WebhookDelivery(
            url=fields["url"],
            event=event_type(fields["api"], fields["state"], fields.get("finish_reason") or None),
            event_id=event_id(job_id),
            status=DeliveryStatus(fields["status"]),
            attempts=int(fields.get("attempts") or 0),
            last_status=int(fields["last_status"]) if fields.get("last_status") else None,
            last_error=fields.get("last_error") or None,
            last_attempt_at=_time(fields.get("last_attempt_at")),
            next_attempt_at=_time(fields.get("next_attempt_at")),
            delivered_at=_time(fields.get("delivered_at")),
        )
