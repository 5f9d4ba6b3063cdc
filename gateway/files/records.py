"""Files' records in Redis: each file's metadata (`Keys.file`), its owner's listings (all of them, and
those of each purpose), the counters of its API key's and tenant's files that bound their uploads
(`Keys.files_usage`), and the files that expire (`Keys.files_expiring`). A file is added and removed
by one script each, so that its listings, its counters and its record never disagree."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

import redis.asyncio as aioredis

from shared.config import GatewaySettings
from shared.errors import RateLimited
from shared.keys import Keys
from shared.redis_client import redis_errors

QUOTA_RETRY_SECONDS = 60  # a file is deleted or expires in the client's own time: no point retrying soon

# A record names the purpose listing and the counters it is in: a tenant may change in the keys file
# between a file's upload and its removal, and a record made before the counters is in none.
_REMOVE = """
local function remove(record, owned, expiring, id)
  local named = redis.call('HMGET', record, 'bytes', 'usage_of_key', 'usage_of_tenant', 'listed_by_purpose')
  if not named[1] then return 0 end
  for _, usage in ipairs({named[2], named[3]}) do
    if usage and usage ~= '' then
      redis.call('HINCRBY', usage, 'count', -1)
      redis.call('HINCRBY', usage, 'bytes', -tonumber(named[1]))
    end
  end
  if named[4] then redis.call('ZREM', named[4], id) end
  redis.call('ZREM', owned, id)
  redis.call('ZREM', expiring, id)
  redis.call('DEL', record)
  return 1
end
"""
ADD = (
    _REMOVE
    + """
-- KEYS: the record, the owner's files, those of its purpose, the key's and the tenant's counters ('':
-- none), the expiring files. ARGV[1]: {id, fields, score, bytes, expires_at (0: never), bounded,
-- bounds: {key: [files, bytes], tenant: [files, bytes]} (0: none)}. A record already there (a batch's
-- file written again by the gateway that took the batch over) is replaced, and counted once.
-- Answers {'added'} or {'too_many', scope, 'files' or 'bytes', what it holds, the bound}.
local record, owned, of_purpose, of_key, of_tenant, expiring = unpack(KEYS)
local args = cjson.decode(ARGV[1])
if args.bounded then
  for _, scope in ipairs({{'key', of_key}, {'tenant', of_tenant}}) do
    local name, usage = unpack(scope)
    local most = args.bounds[name]
    if usage ~= '' then
      local held = redis.call('HMGET', usage, 'count', 'bytes')
      local count, bytes = tonumber(held[1] or 0), tonumber(held[2] or 0)
      if most[1] > 0 and count + 1 > most[1] then
        return {'too_many', name, 'files', count, most[1]}
      end
      if most[2] > 0 and bytes + args.bytes > most[2] then
        return {'too_many', name, 'bytes', bytes, most[2]}
      end
    end
  end
end
remove(record, owned, expiring, args.id)
for name, value in pairs(args.fields) do redis.call('HSET', record, name, value) end
redis.call('HSET', record, 'usage_of_key', of_key, 'usage_of_tenant', of_tenant)
redis.call('HSET', record, 'listed_by_purpose', of_purpose)
redis.call('ZADD', owned, args.score, args.id)
redis.call('ZADD', of_purpose, args.score, args.id)
for _, usage in ipairs({of_key, of_tenant}) do
  if usage ~= '' then
    redis.call('HINCRBY', usage, 'count', 1)
    redis.call('HINCRBY', usage, 'bytes', args.bytes)
  end
end
if args.expires_at > 0 then redis.call('ZADD', expiring, args.expires_at, args.id) end
return {'added'}
"""
)
REMOVE = (
    _REMOVE
    + """
-- KEYS: the record, the owner's files, the expiring files. ARGV: the id, the owner. Answers 1 where
-- the owner's record was there, 0 otherwise (and a file without a record no longer expires).
local owner = redis.call('HGET', KEYS[1], 'owner')
if owner ~= ARGV[2] then
  if not owner then redis.call('ZREM', KEYS[3], ARGV[1]) end
  return 0
end
return remove(KEYS[1], KEYS[2], KEYS[3], ARGV[1])
"""
)

Scope = Literal["key", "tenant"]


@dataclass(frozen=True)
class FileBounds:
    """Most files and bytes one API key's files and one tenant's hold (0: no bound)."""

    files_of_key: int
    bytes_of_key: int
    files_of_tenant: int
    bytes_of_tenant: int

    @classmethod
    def of_settings(cls, settings: GatewaySettings) -> FileBounds:
        return cls(
            settings.files_max_per_key,
            settings.files_max_bytes_per_key,
            settings.files_max_per_tenant,
            settings.files_max_bytes_per_tenant,
        )

    def of(self, scope: Scope) -> tuple[int, int]:
        if scope == "key":
            return self.files_of_key, self.bytes_of_key
        return self.files_of_tenant, self.bytes_of_tenant


def over_bound(scope: Scope, what: str, held: int, most: int, size: int) -> RateLimited:
    """The refusal of an upload that the key's or the tenant's files leave no room for (`size`: the
    upload's bytes, 0 before any is read)."""
    holder = "this API key's files" if scope == "key" else "the files of this key's tenant"
    setting = f"files_max_{'bytes_' if what == 'bytes' else ''}per_{scope}"
    if what == "files":
        message = f"{holder} number {held}, the most they may ({setting}: {most})"
    elif size == 0:
        message = f"{holder} hold {held} bytes, the most they may ({setting}: {most})"
    else:
        message = f"{holder} hold {held} bytes: with this file's {size} they would pass {setting} ({most})"
    return RateLimited(
        f"{message}: delete a file, or wait for one to expire", limit=setting, retry_after=QUOTA_RETRY_SECONDS
    )


@dataclass(frozen=True)
class Room:
    """The bytes an upload may still take (None: no bound), and the bound that leaves it no more."""

    left: int | None = None
    scope: Scope = "key"
    held: int = 0
    most: int = 0

    def check(self, size: int) -> None:
        """`RateLimited` once an upload of `size` bytes would not fit."""
        if self.left is not None and size > self.left:
            raise over_bound(self.scope, "bytes", self.held, self.most, size)


class FileRecords:
    """The Redis side of the files: records added within the bounds, read, listed and removed."""

    def __init__(self, redis: aioredis.Redis, keys: Keys, bounds: FileBounds) -> None:
        self.redis = redis
        self.keys = keys
        self.bounds = bounds
        self._add = redis.register_script(ADD)
        self._remove = redis.register_script(REMOVE)

    def _usage(self, owner: str, tenant: str | None) -> dict[Scope, str]:
        scopes: dict[Scope, str] = {"key": self.keys.files_usage(f"key:{owner}")}
        if tenant is not None:
            scopes["tenant"] = self.keys.files_usage(f"tenant:{tenant}")
        return scopes

    async def check_room(self, owner: str, tenant: str | None) -> Room:
        """The bytes the key's and the tenant's files leave room for; `RateLimited` where either holds
        as many files or bytes as it may already."""
        room = Room()
        for scope, usage in self._usage(owner, tenant).items():
            most_files, most_bytes = self.bounds.of(scope)
            with redis_errors():
                count, size = await self.redis.hmget(usage, ["count", "bytes"])  # type: ignore[misc]
            held_files, held_bytes = int(count or 0), int(size or 0)
            if most_files and held_files >= most_files:
                raise over_bound(scope, "files", held_files, most_files, 0)
            if most_bytes and (room.left is None or most_bytes - held_bytes < room.left):
                room = Room(most_bytes - held_bytes, scope, held_bytes, most_bytes)
        if room.left is not None and room.left <= 0:
            raise over_bound(room.scope, "bytes", room.held, room.most, 0)
        return room

    async def add(
        self,
        fields: Mapping[str, Any],
        score: int,
        owner: str,
        tenant: str | None,
        expires_at: int | None,
        bounded: bool,
    ) -> None:
        """The record of a file whose bytes are stored (`fields`: its `FileObject`'s), listed by `score`
        (its creation, ms); `RateLimited`, and nothing written, where `bounded` and the key's or the
        tenant's files leave it no room."""
        file_id, purpose, size = str(fields["id"]), str(fields["purpose"]), int(fields["bytes"])
        usage = self._usage(owner, tenant)
        args = {
            "id": file_id,
            "fields": {**{name: str(value) for name, value in fields.items()}, "owner": owner},
            "score": score,
            "bytes": size,
            "expires_at": expires_at or 0,
            "bounded": bounded,
            "bounds": {"key": self.bounds.of("key"), "tenant": self.bounds.of("tenant")},
        }
        keys = [
            self.keys.file(file_id),
            self.keys.files(owner),
            self.keys.files_of_purpose(owner, purpose),
            usage["key"],
            usage.get("tenant", ""),
            self.keys.files_expiring,
        ]
        with redis_errors():
            outcome, *refusal = await self._add(keys, [json.dumps(args)])
        if outcome == "too_many":
            scope, what, held, most = refusal
            raise over_bound(scope, what, held, most, size)

    async def read(self, file_ids: list[str]) -> list[dict[str, str]]:
        """The records of `file_ids`, in their order (an empty one for a file that is gone)."""
        with redis_errors():
            async with self.redis.pipeline(transaction=False) as pipe:
                for file_id in file_ids:
                    pipe.hgetall(self.keys.file(file_id))
                return await pipe.execute()

    async def remove(self, file_id: str, owner: str) -> bool:
        """Remove the owner's file's record from everywhere it is listed and counted; whether it was
        there. A file with no record (`owner` is then '') is taken out of the expiring ones."""
        keys = [self.keys.file(file_id), self.keys.files(owner), self.keys.files_expiring]
        with redis_errors():
            return bool(await self._remove(keys, [file_id, owner]))

    async def due(self, now: float, count: int) -> list[str]:
        """Up to `count` files whose `expires_at` has come."""
        with redis_errors():
            due: list[str] = await self.redis.zrangebyscore(self.keys.files_expiring, "-inf", now, 0, count)
        return due
