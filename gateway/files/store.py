"""Files: their metadata in Redis (`gateway.files.records`), their bytes in `FileStorage`, each the
caller's own (another key's file is not found), each within its key's and its tenant's bounds, and
gone once its `expires_at` has come."""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator, Callable, Mapping

import redis.asyncio as aioredis

from gateway.files.jsonl import Line, LineSplitter
from gateway.files.records import FileBounds, FileRecords, Room
from gateway.files.storage import FileStorage
from shared.batches import FILE_ID_PREFIX, FileObject, FilePurpose
from shared.config import GatewaySettings
from shared.errors import JobNotFound, StreampoolError
from shared.keys import Keys
from shared.redis_client import redis_errors
from shared.tenants import Tenant

FILE_ID_LENGTH = len(FILE_ID_PREFIX) + 32
WRITTEN: frozenset[FilePurpose] = frozenset({"batch_output"})
"""The purposes of the files a gateway writes itself (a batch's output and error files): counted in
their key's and tenant's files but never refused, which would lose the batch's results."""
SWEEP_GROUP = 100  # expired files removed a group at a time


def new_file_id() -> str:
    return FILE_ID_PREFIX + uuid.uuid4().hex


def _expired(found: FileObject, now: float) -> bool:
    return found.expires_at is not None and found.expires_at <= now


def _owned(fields: dict[str, str], owner: str) -> FileObject | None:
    """The file of a record if it is `owner`'s."""
    if fields.get("owner") != owner:
        return None
    return FileObject.model_validate(fields)


class Files:
    """Every file a gateway serves: made, listed, read, deleted and expired for their owner."""

    def __init__(
        self,
        redis: aioredis.Redis,
        keys: Keys,
        storage: FileStorage,
        settings: GatewaySettings,
        tenants: Mapping[str, Tenant],
    ) -> None:
        self.redis = redis
        self.keys = keys
        self.storage = storage
        self.records = FileRecords(redis, keys, FileBounds.of_settings(settings))
        self.tenants = tenants
        self.written_expire_seconds = settings.files_batch_output_expire_seconds

    async def create(
        self,
        file_id: str,
        owner: str,
        filename: Callable[[], str],
        purpose: FilePurpose,
        chunks: AsyncIterator[bytes],
        expires_after: Callable[[], int | None] = lambda: None,
    ) -> FileObject:
        """Write `chunks` as the file `file_id`, then its metadata: a file is listed only once its bytes
        are all stored. A write that fails (the chunks raised, or the file does not fit its key's or
        its tenant's bounds: `RateLimited`) leaves nothing behind. `filename` is asked for once the
        chunks are read (an upload's form may name it anywhere), and so is `expires_after` (seconds
        from its creation, None: never); a file the gateway writes expires after
        `files_batch_output_expire_seconds`."""
        tenant = found.name if (found := self.tenants.get(owner)) else None
        bounded = purpose not in WRITTEN
        room = await self.records.check_room(owner, tenant) if bounded else Room()
        counted = _Counted(chunks, room)
        try:
            await self.storage.write(file_id, counted.chunks())
        except BaseException:
            await self.storage.delete(file_id)
            raise
        if counted.error is not None:
            await self.storage.delete(file_id)
            raise counted.error
        created = time.time()
        lifetime = self.written_expire_seconds if purpose in WRITTEN else expires_after()
        made = FileObject(
            id=file_id,
            bytes=counted.size,
            created_at=int(created),
            filename=filename(),
            purpose=purpose,
            expires_at=int(created) + lifetime if lifetime else None,
        )
        try:
            await self.records.add(
                made.model_dump(exclude_none=True),
                int(created * 1000),
                owner,
                tenant,
                made.expires_at,
                bounded,
            )
        except BaseException:
            await self.storage.delete(file_id)
            raise
        return made

    async def get(self, file_id: str, owner: str) -> FileObject:
        """The file's object; `JobNotFound` unless it exists, is `owner`'s and has not expired (an
        expired one is removed then)."""
        if not file_id.startswith(FILE_ID_PREFIX) or len(file_id) > FILE_ID_LENGTH:
            raise JobNotFound(f"no file {file_id}")
        (fields,) = await self.records.read([file_id])
        found = _owned(fields, owner)
        if found is None:
            raise JobNotFound(f"no file {file_id}")
        if _expired(found, time.time()):
            await self._remove(file_id, owner)
            raise JobNotFound(f"no file {file_id}")
        return found

    async def of_owner(
        self, owner: str, after: str | None, limit: int, ascending: bool, purpose: str | None
    ) -> tuple[list[FileObject], bool]:
        """The owner's files (of `purpose` alone, from that purpose's own listing) after `after`, in
        the order asked for (newest first by default), at most `limit`, and whether more follow. An
        expired file the sweeper has not removed yet is passed over."""
        key = self.keys.files(owner) if purpose is None else self.keys.files_of_purpose(owner, purpose)
        now = time.time()
        files: list[FileObject] = []
        start = await start_of(self.redis, key, after, ascending)
        while len(files) <= limit:
            wanted = limit + 1 - len(files)
            ids = await members(self.redis, key, start, wanted, ascending)
            for fields in await self.records.read(ids):
                found = _owned(fields, owner)
                if found is not None and not _expired(found, now):
                    files.append(found)
            if len(ids) < wanted:
                break
            start += len(ids)
        return files[:limit], len(files) > limit

    async def delete(self, file_id: str, owner: str) -> None:
        """Remove the owner's file: its metadata first (it is gone for every reader), then its bytes."""
        await self.get(file_id, owner)
        if not await self._remove(file_id, owner):
            raise JobNotFound(f"no file {file_id}")

    async def _remove(self, file_id: str, owner: str) -> bool:
        """Remove the file's record, then its bytes; whether it was there to remove."""
        removed = await self.records.remove(file_id, owner)
        if removed:
            await self.storage.delete(file_id)
        return removed

    async def expire_due(self) -> int:
        """Remove every file whose `expires_at` has come, a group at a time; how many were."""
        removed = 0
        while True:
            due = await self.records.due(time.time(), SWEEP_GROUP)
            for file_id, fields in zip(due, await self.records.read(due), strict=True):
                removed += await self._remove(file_id, fields.get("owner", ""))
            if len(due) < SWEEP_GROUP:
                return removed

    async def content(self, file_id: str, owner: str) -> AsyncIterator[bytes]:
        """The owner's file's bytes, a chunk at a time."""
        await self.get(file_id, owner)
        return self.storage.read(file_id)

    async def lines(
        self, file_id: str, max_line_bytes: int, offset: int = 0, first: int = 1
    ) -> AsyncIterator[Line]:
        """The file's lines from byte `offset` (where line `first` begins), read as they are needed."""
        splitter = LineSplitter(max_line_bytes, offset, first)
        async for chunk in self.storage.read(file_id, offset):
            for line in splitter.feed(chunk):
                yield line
        for line in splitter.finish():
            yield line


class _Counted:
    """Chunks passed through, counted and held to the `room` their file has; a refusal they raise is
    kept (and the write ends there), for `Files.create` to raise once the storage is done with them."""

    def __init__(self, chunks: AsyncIterator[bytes], room: Room) -> None:
        self.source = chunks
        self.room = room
        self.size = 0
        self.error: StreampoolError | None = None

    async def chunks(self) -> AsyncIterator[bytes]:
        try:
            async for chunk in self.source:
                self.size += len(chunk)
                self.room.check(self.size)
                yield chunk
        except StreampoolError as exc:
            self.error = exc


async def start_of(redis: aioredis.Redis, key: str, after: str | None, ascending: bool) -> int:
    """The rank in the sorted set `key` just past the member `after` (0: none, or one not there)."""
    if after is None:
        return 0
    with redis_errors():
        rank = await (redis.zrank(key, after) if ascending else redis.zrevrank(key, after))
    return 0 if rank is None else rank + 1


async def members(redis: aioredis.Redis, key: str, start: int, count: int, ascending: bool) -> list[str]:
    """Up to `count` (-1: all) members of the sorted set `key` from rank `start`, by score."""
    stop = -1 if count < 0 else start + count - 1
    with redis_errors():
        if ascending:
            found: list[str] = await redis.zrange(key, start, stop)
        else:
            found = await redis.zrevrange(key, start, stop)
    return found


async def page(redis: aioredis.Redis, key: str, after: str | None, count: int, ascending: bool) -> list[str]:
    """Up to `count` (-1: all) members of the sorted set `key` after the member `after`, by score."""
    return await members(redis, key, await start_of(redis, key, after, ascending), count, ascending)
