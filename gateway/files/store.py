"""Files: their metadata in Redis (`Keys.file`, `Keys.files`), their bytes in `FileStorage`, each the
caller's own (another key's file is not found)."""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator, Callable

import redis.asyncio as aioredis

from gateway.files.jsonl import Line, LineSplitter
from gateway.files.storage import FileStorage
from shared.batches import FILE_ID_PREFIX, FileObject, FilePurpose
from shared.errors import JobNotFound, StreampoolError
from shared.keys import Keys
from shared.redis_client import redis_errors

FILE_ID_LENGTH = len(FILE_ID_PREFIX) + 32


def new_file_id() -> str:
    return FILE_ID_PREFIX + uuid.uuid4().hex


class Files:
    """Every file a gateway serves: made, listed, read and deleted for their owner."""

    def __init__(self, redis: aioredis.Redis, keys: Keys, storage: FileStorage) -> None:
        self.redis = redis
        self.keys = keys
        self.storage = storage

    async def create(
        self,
        file_id: str,
        owner: str,
        filename: Callable[[], str],
        purpose: FilePurpose,
        chunks: AsyncIterator[bytes],
    ) -> FileObject:
        """Write `chunks` as the file `file_id`, then its metadata: a file is listed only once its bytes
        are all stored. A write that fails (the chunks raised) leaves nothing behind. `filename` is
        asked for once the chunks are read (an upload's form may name it anywhere)."""
        counted = _Counted(chunks)
        try:
            await self.storage.write(file_id, counted.chunks())
        except BaseException:
            await self.storage.delete(file_id)
            raise
        if counted.error is not None:
            await self.storage.delete(file_id)
            raise counted.error
        created = time.time()
        made = FileObject(
            id=file_id,
            bytes=counted.size,
            created_at=int(created),
            filename=filename(),
            purpose=purpose,
        )
        with redis_errors():
            async with self.redis.pipeline(transaction=True) as pipe:
                pipe.hset(
                    self.keys.file(file_id), mapping={**made.model_dump(exclude_none=True), "owner": owner}
                )
                pipe.zadd(self.keys.files(owner), {file_id: int(created * 1000)})
                await pipe.execute()
        return made

    async def get(self, file_id: str, owner: str) -> FileObject:
        """The file's object; `JobNotFound` unless it exists and is `owner`'s."""
        if not file_id.startswith(FILE_ID_PREFIX) or len(file_id) > FILE_ID_LENGTH:
            raise JobNotFound(f"no file {file_id}")
        with redis_errors():
            fields = await self.redis.hgetall(self.keys.file(file_id))  # type: ignore[misc]
        if fields.pop("owner", None) != owner:
            raise JobNotFound(f"no file {file_id}")
        return FileObject.model_validate(fields)

    async def of_owner(
        self, owner: str, after: str | None, limit: int, ascending: bool, purpose: str | None
    ) -> tuple[list[FileObject], bool]:
        """The owner's files after `after` (in the order asked for, newest first by default), at most
        `limit`, and whether more follow."""
        ids = await page(
            self.redis, self.keys.files(owner), after, limit + 1 if not purpose else -1, ascending
        )
        files: list[FileObject] = []
        for file_id in ids:
            try:
                found = await self.get(file_id, owner)
            except JobNotFound:
                continue
            if purpose is None or found.purpose == purpose:
                files.append(found)
        return files[:limit], len(files) > limit

    async def delete(self, file_id: str, owner: str) -> None:
        """Remove the owner's file: its metadata first (it is gone for every reader), then its bytes."""
        await self.get(file_id, owner)
        with redis_errors():
            async with self.redis.pipeline(transaction=True) as pipe:
                pipe.delete(self.keys.file(file_id))
                pipe.zrem(self.keys.files(owner), file_id)
                await pipe.execute()
        await self.storage.delete(file_id)

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
    """Chunks passed through, counted; a refusal they raise is kept (and the write ends there), for
    `Files.create` to raise once the storage is done with them."""

    def __init__(self, chunks: AsyncIterator[bytes]) -> None:
        self.source = chunks
        self.size = 0
        self.error: StreampoolError | None = None

    async def chunks(self) -> AsyncIterator[bytes]:
        try:
            async for chunk in self.source:
                self.size += len(chunk)
                yield chunk
        except StreampoolError as exc:
            self.error = exc


async def page(redis: aioredis.Redis, key: str, after: str | None, count: int, ascending: bool) -> list[str]:
    """Up to `count` (-1: all) members of the sorted set `key` after the member `after`, by score."""
    with redis_errors():
        start = 0
        if after is not None:
            rank = await (redis.zrank(key, after) if ascending else redis.zrevrank(key, after))
            start = 0 if rank is None else rank + 1
        stop = -1 if count < 0 else start + count - 1
        if ascending:
            members: list[str] = await redis.zrange(key, start, stop)
        else:
            members = await redis.zrevrange(key, start, stop)
    return members
