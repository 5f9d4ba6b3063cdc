"""OpenAI's Files and Batches objects (`openai.types.FileObject`, `Batch`), and what a batch's jobs are.

A batch's lines become ordinary jobs, each with its record and stream, in the batch band of their
model's queue: each tenant's batch jobs wait in a share of their own (`batch:<tenant>`), and the
band's shares are served only once no interactive share has a job to give (`claim.lua`).

Why a band and reserved slots rather than vLLM's priority scheduling: the engine's priority only
orders the jobs a worker has already taken, so an interactive job still waits for a worker's slot
behind a full batch, and a preemption costs the batch job its KV cache (recomputed when it resumes).
So the queue serves interactive jobs first, and each worker keeps `batch_reserved_share` of its slots
for them: however many batch jobs wait, a worker never runs more than the rest, and an interactive
job finds a free slot at once. A batch then runs in the gaps interactive work leaves, at the
engine's full batch size less the reserve.

A line's job id is derived from the batch's id and the line's number (`line_job_id`), so that a
gateway that takes over a batch's feeding from one that crashed submits no line twice: the submit
script answers `existing` for a record that is there.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any, Generic, Literal, TypeVar

from pydantic import BaseModel, Field
from typing_extensions import Self

BATCH_SHARE_PREFIX = "batch:"
FILE_ID_PREFIX = "file-"
BATCH_ID_PREFIX = "batch_"
BATCH_REQUEST_PREFIX = "batch_req_"
COMPLETION_WINDOW = "24h"
ENDPOINTS = ("/v1/chat/completions", "/v1/completions", "/v1/responses", "/v1/embeddings")

BatchStatus = Literal[
    "validating", "failed", "in_progress", "finalizing", "completed", "expired", "cancelling", "cancelled"
]
ENDED: frozenset[str] = frozenset({"failed", "completed", "expired", "cancelled"})
FilePurpose = Literal["batch", "batch_output"]


def batch_share(tenant: str) -> str:
    """The share of the batch band a tenant's batch jobs wait in (`share_member.lua`'s `share_band`)."""
    return BATCH_SHARE_PREFIX + tenant


@dataclass(frozen=True)
class BatchLineJob:
    """What makes a job a batch's line: its batch, its line's number (from 1), and the end of the batch's
    window, until which the job may wait for a worker (the window's end cancels it, a lapse never)."""

    batch_id: str
    number: int
    expires_at: int

    @property
    def job_id(self) -> str:
        return line_job_id(self.batch_id, self.number)


def line_job_id(batch_id: str, line: int) -> str:
    """The job of line `line` (from 1) of batch `batch_id`: 32 hex digits, the one format of a job id."""
    return hashlib.sha256(f"{batch_id}:{line}".encode()).hexdigest()[:32]


class FileObject(BaseModel):
    """`openai.types.FileObject`."""

    id: str
    object: Literal["file"] = "file"
    bytes: int
    created_at: int
    filename: str
    purpose: FilePurpose
    status: Literal["uploaded", "processed", "error"] = "processed"
    expires_at: int | None = None
    status_details: str | None = None


Item = TypeVar("Item", "FileObject", "BatchObject")


class Page(BaseModel, Generic[Item]):
    """A page of a list, as OpenAI's cursor pages (`SyncCursorPage`) read it."""

    object: Literal["list"] = "list"
    data: list[Item]
    first_id: str | None = None
    last_id: str | None = None
    has_more: bool = False

    @classmethod
    def of(cls, items: list[Item], more: bool) -> Self:
        """`items`, and whether more follow the last."""
        first, last = (items[0].id, items[-1].id) if items else (None, None)
        return cls(data=items, first_id=first, last_id=last, has_more=more)


class FileList(Page[FileObject]):
    pass


class FileDeleted(BaseModel):
    id: str
    object: Literal["file"] = "file"
    deleted: bool = True


class RequestCounts(BaseModel):
    """`openai.types.BatchRequestCounts`: every line ends counted in `completed` or `failed`."""

    total: int = 0
    completed: int = 0
    failed: int = 0


class BatchError(BaseModel):
    """`openai.types.BatchError`: why a batch failed validation, at which line (from 1)."""

    code: str
    message: str
    param: str | None = None
    line: int | None = None


class BatchErrors(BaseModel):
    object: Literal["list"] = "list"
    data: list[BatchError]


class BatchObject(BaseModel):
    """`openai.types.Batch`."""

    id: str
    object: Literal["batch"] = "batch"
    endpoint: str
    errors: BatchErrors | None = None
    input_file_id: str
    completion_window: str = COMPLETION_WINDOW
    status: BatchStatus
    output_file_id: str | None = None
    error_file_id: str | None = None
    created_at: int
    in_progress_at: int | None = None
    expires_at: int | None = None
    finalizing_at: int | None = None
    completed_at: int | None = None
    failed_at: int | None = None
    expired_at: int | None = None
    cancelling_at: int | None = None
    cancelled_at: int | None = None
    request_counts: RequestCounts = Field(default_factory=RequestCounts)
    metadata: dict[str, str] | None = None


class BatchList(Page[BatchObject]):
    pass


class BatchCreate(BaseModel):
    """`POST /v1/batches`'s body, as `client.batches.create` sends it."""

    input_file_id: str = Field(max_length=64)
    endpoint: Literal["/v1/chat/completions", "/v1/completions", "/v1/responses", "/v1/embeddings"]
    completion_window: Literal["24h"]
    metadata: dict[str, str] | None = Field(None, max_length=16)


def output_line(custom_id: str, job_id: str, status_code: int, body: dict[str, Any]) -> dict[str, Any]:
    """A line of the output file (status 200) or of the error file (any other), as OpenAI writes them."""
    return {
        "id": BATCH_REQUEST_PREFIX + job_id,
        "custom_id": custom_id,
        "response": {"status_code": status_code, "request_id": job_id, "body": body},
        "error": None,
    }


def unrun_line(custom_id: str, job_id: str, code: str, message: str) -> dict[str, Any]:
    """A line of the error file for a request that never answered: cancelled or past the window."""
    return {
        "id": BATCH_REQUEST_PREFIX + job_id,
        "custom_id": custom_id,
        "response": None,
        "error": {"code": code, "message": message},
    }
