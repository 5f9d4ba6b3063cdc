"""OpenAI's Batch API (`client.batches`): a batch of an input file's requests, run as jobs in the batch
band of the queue (`shared.batches`) and driven to its end by any gateway (`gateway.batch_driver`).
A batch is its API key's: another key's is not found (404)."""

from __future__ import annotations

import time
from typing import Annotated

from fastapi import APIRouter, Query

from gateway.auth import REQUIRE_KEY, Owner
from gateway.deps import ServicesDep
from gateway.routes.openai import ERRORS, OpenAIRoute
from shared.batches import BatchCreate, BatchList, BatchObject
from shared.webhooks import BATCH_API

router = APIRouter(
    prefix="/v1/batches",
    tags=["batches"],
    dependencies=[REQUIRE_KEY],
    responses=ERRORS,
    route_class=OpenAIRoute,
)


@router.post("", response_model=BatchObject)
async def create_batch(body: BatchCreate, owner: Owner, services: ServicesDep) -> BatchObject:
    """A batch of the key's input file, `validating` at once; its lines are checked, then run."""
    await services.files.get(body.input_file_id, owner)
    webhook = services.webhook_targets.annotations(owner, None, BATCH_API)
    tenant = services.admission.tenants.get(owner)
    return await services.batches.create(
        body, owner, tenant.name if tenant else None, services.settings.batch_window_seconds, webhook
    )


@router.get("/{batch_id}", response_model=BatchObject)
async def retrieve_batch(batch_id: str, owner: Owner, services: ServicesDep) -> BatchObject:
    return await services.batches.get(batch_id, owner)


@router.get("", response_model=BatchList)
async def list_batches(
    owner: Owner,
    services: ServicesDep,
    after: Annotated[str | None, Query(max_length=64)] = None,
    limit: Annotated[int, Query(ge=1, le=100)] = 20,
) -> BatchList:
    """The key's batches, newest first; a page of `limit` after the batch `after`."""
    return BatchList.of(*await services.batches.of_owner(owner, after, limit))


@router.post("/{batch_id}/cancel", response_model=BatchObject)
async def cancel_batch(batch_id: str, owner: Owner, services: ServicesDep) -> BatchObject:
    """`cancelling` at once: no more lines go in, its jobs queued or running are cancelled, and it ends
    `cancelled` with the files of what finished. A batch past that point is answered as it stands."""
    await services.batches.get(batch_id, owner)
    await services.batches.move(
        batch_id, ("validating", "in_progress"), "cancelling", cancelling_at=int(time.time())
    )
    return await services.batches.get(batch_id, owner)
