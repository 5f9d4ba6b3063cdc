"""Where files' bytes live: a local folder (every gateway mounts the same one) or S3-compatible object
storage, both through obstore, so one code path streams to and from either: a write takes an async
iterator of chunks and lands whole or not at all (a local file is renamed into place, an object's
multipart upload completes at its end), a read streams from any byte offset.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import obstore
from obstore.store import LocalStore, ObjectStore, S3Store

from shared.config import GatewaySettings

READ_CHUNK_BYTES = 256 * 1024  # what a read hands on at a time: a gateway holds about this much of a file
WRITE_PART_BYTES = 5 * 1024 * 1024  # S3's smallest multipart part


class FileStorage:
    """Files' bytes by name."""

    def __init__(self, store: ObjectStore) -> None:
        self.store = store

    @classmethod
    def of_settings(cls, settings: GatewaySettings) -> FileStorage:
        """`files_url`'s object storage, or else the folder `files_dir`."""
        if not settings.files_url:
            return cls(LocalStore(settings.files_dir, mkdir=True))
        config = {
            "region": settings.files_s3_region,
            **({"endpoint": settings.files_s3_endpoint} if settings.files_s3_endpoint else {}),
            **({"access_key_id": settings.files_s3_access_key_id} if settings.files_s3_access_key_id else {}),
            **(
                {"secret_access_key": settings.files_s3_secret_access_key}
                if settings.files_s3_secret_access_key
                else {}
            ),
        }
        http = bool(settings.files_s3_endpoint and settings.files_s3_endpoint.startswith("http://"))
        return cls(
            S3Store.from_url(
                settings.files_url,
                config=config,  # type: ignore[arg-type]
                client_options={"allow_http": http},
                virtual_hosted_style_request=False,
            )
        )

    async def write(self, name: str, chunks: AsyncIterator[bytes]) -> None:
        """The file `name`, from `chunks`, replacing any file of that name once all of it is written."""
        await obstore.put_async(self.store, name, chunks, chunk_size=WRITE_PART_BYTES, max_concurrency=2)

    async def read(self, name: str, offset: int = 0) -> AsyncIterator[bytes]:
        """The bytes of `name` from `offset` on, a chunk at a time (`FileNotFoundError` if it is gone)."""
        if offset:
            size = (await obstore.head_async(self.store, name))["size"]
            if offset >= size:
                return
        options = {"range": {"offset": offset}} if offset else None
        result = await obstore.get_async(self.store, name, options=options)  # type: ignore[arg-type]
        async for chunk in result.stream(min_chunk_size=READ_CHUNK_BYTES):
            yield bytes(chunk)

    async def delete(self, name: str) -> None:
        """Remove `name`; one already gone is no error."""
        try:
            await obstore.delete_async(self.store, name)
        except FileNotFoundError:
            pass
