"""OpenAI's Files API (`client.files`), for batch input files and the output and error files batches
write: `POST /v1/files` streams the upload to the file storage, `GET .../content` streams it back.
A file is its API key's: another key's is not found (404)."""

from __future__ import annotations

from typing import Annotated, Literal

from fastapi import APIRouter, Query, Request
from fastapi.responses import StreamingResponse

from gateway.auth import REQUIRE_KEY, Owner
from gateway.deps import ServicesDep
from gateway.files.store import new_file_id
from gateway.files.upload import EXPIRES_AFTER_SECONDS, Upload, boundary_of
from gateway.routes.openai import ERRORS, OpenAIRoute
from shared.batches import FileDeleted, FileList, FileObject

FILES_PATH = "/v1/files"
UPLOAD_FORM = {
    "requestBody": {
        "required": True,
        "content": {
            "multipart/form-data": {
                "schema": {
                    "type": "object",
                    "required": ["file", "purpose"],
                    "properties": {
                        "file": {
                            "type": "string",
                            "format": "binary",
                            "description": "JSONL, one request a line",
                        },
                        "purpose": {"type": "string", "enum": ["batch"]},
                        "expires_after[anchor]": {"type": "string", "enum": ["created_at"]},
                        "expires_after[seconds]": {
                            "type": "integer",
                            "minimum": EXPIRES_AFTER_SECONDS[0],
                            "maximum": EXPIRES_AFTER_SECONDS[1],
                        },
                    },
                }
            }
        },
    }
}

router = APIRouter(
    prefix=FILES_PATH, tags=["files"], dependencies=[REQUIRE_KEY], responses=ERRORS, route_class=OpenAIRoute
)


@router.post("", response_model=FileObject, openapi_extra=UPLOAD_FORM)
async def create_file(request: Request, owner: Owner, services: ServicesDep) -> FileObject:
    """Upload a batch input file (`purpose: batch`): JSONL of at most `max_file_lines` lines and
    `max_file_bytes` bytes, each line a JSON object (what each must hold is checked by the batch),
    the rest of the form at most `max_body_bytes`; within the key's and its tenant's bounds on files
    (429 past them); gone after `expires_after[seconds]` where the form names it."""
    settings = services.settings
    upload = Upload(
        request.stream(),
        boundary_of(request.headers.get("content-type", "")),
        settings.max_file_bytes,
        settings.max_file_lines,
        settings.max_body_bytes,
        settings.max_body_bytes,
    )
    return await services.files.create(
        new_file_id(),
        owner,
        lambda: upload.filename or "",
        "batch",
        upload.file_chunks(),
        lambda: upload.expires_after,
    )


@router.get("", response_model=FileList)
async def list_files(
    owner: Owner,
    services: ServicesDep,
    after: Annotated[str | None, Query(max_length=64)] = None,
    limit: Annotated[int, Query(ge=1, le=10_000)] = 10_000,
    order: Literal["asc", "desc"] = "desc",
    purpose: Annotated[str | None, Query(max_length=64)] = None,
) -> FileList:
    """The key's files, newest first unless `order=asc`; a page of `limit` after the file `after`."""
    return FileList.of(*await services.files.of_owner(owner, after, limit, order == "asc", purpose))


@router.get("/{file_id}", response_model=FileObject)
async def retrieve_file(file_id: str, owner: Owner, services: ServicesDep) -> FileObject:
    return await services.files.get(file_id, owner)


@router.get("/{file_id}/content", response_class=StreamingResponse)
async def file_content(file_id: str, owner: Owner, services: ServicesDep) -> StreamingResponse:
    """The file's bytes, streamed from the storage."""
    return StreamingResponse(
        await services.files.content(file_id, owner), media_type="application/octet-stream"
    )


@router.delete("/{file_id}", response_model=FileDeleted)
async def delete_file(file_id: str, owner: Owner, services: ServicesDep) -> FileDeleted:
    await services.files.delete(file_id, owner)
    return FileDeleted(id=file_id)
