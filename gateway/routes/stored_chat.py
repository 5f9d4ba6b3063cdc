"""OpenAI's stored chat completions: a chat completion made with `store: true` is kept, with its
`metadata`, for the retention period, and read back, listed, given new metadata and deleted as the
`openai` package's `chat.completions.retrieve/list/update/delete/messages.list` ask.

A stored completion is its job (`gateway.stored_completions`): its ChatCompletion is made again from
the job's request and events, its messages are the job's request's. As on OpenAI, a completion is
stored once it is answered: until its job has completed (and for one that failed or was cancelled) it
is 404 here, and its stream can be resumed instead (`gateway.routes.resume`). Everything is under the
API key that made the completion: any other key gets 404.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Annotated, Literal

from fastapi import APIRouter, Depends, Path, Query, Request
from fastapi.responses import JSONResponse

from gateway.auth import REQUIRE_KEY, Owner
from gateway.compat.openai_answers import item_list, list_object
from gateway.compat.openai_bodies import CHAT_COMPLETIONS_PATH
from gateway.compat.stored_chat import (
    COMPLETION_PREFIX,
    MetadataUpdate,
    deleted,
    listed,
    metadata_filter,
    store_messages,
)
from gateway.deps import ServicesDep, prefixed_job_id
from gateway.routes.openai import ERRORS, OpenAIRoute
from gateway.stored_completions import StoredCompletion, StoredCompletions
from shared.errors import JobNotFound

router = APIRouter(
    prefix=CHAT_COMPLETIONS_PATH,
    tags=["openai"],
    dependencies=[REQUIRE_KEY],
    responses=ERRORS,
    route_class=OpenAIRoute,
)

CompletionIdPath = Annotated[str, Path(description="chatcmpl- and the job's 32 lowercase hex digits")]
Limit = Annotated[int, Query(ge=1, le=100)]
Order = Literal["asc", "desc"]
After = Annotated[str | None, Query(max_length=256)]


async def _completions(services: ServicesDep) -> StoredCompletions:
    return StoredCompletions(services)


Completions = Annotated[StoredCompletions, Depends(_completions)]


def _missing(completion_id: str) -> JobNotFound:
    return JobNotFound(f"Chat completion with id '{completion_id}' not found.")


async def _stored(
    completion_id: CompletionIdPath, owner: Owner, completions: Completions
) -> StoredCompletion:
    """The caller's completed stored completion of the path."""
    job_id = prefixed_job_id(completion_id, COMPLETION_PREFIX)
    if job_id is None:
        raise _missing(completion_id)
    return await completions.completed(owner, job_id, _missing(completion_id))


Stored = Annotated[StoredCompletion, Depends(_stored)]


async def _answer(completions: StoredCompletions, completion: StoredCompletion) -> JSONResponse:
    """The completion's ChatCompletion; 404 if its job is gone since it was read."""
    for answer in await completions.answers([completion]):
        return JSONResponse(answer)
    raise _missing(COMPLETION_PREFIX + completion.job_id)


@router.get("")
async def list_chat_completions(
    request: Request,
    owner: Owner,
    completions: Completions,
    after: After = None,
    limit: Limit = 20,
    order: Order = "asc",
    model: Annotated[str | None, Query(max_length=256)] = None,
) -> JSONResponse:
    """The caller's stored chat completions, oldest first (`order=desc`: newest first), those of
    `model` (as their requests named it) and with every `metadata[key]=value` given alone."""
    wanted = metadata_filter(request.query_params.multi_items())
    page, has_more = await completions.page(
        owner,
        None if after is None else after.removeprefix(COMPLETION_PREFIX),
        limit,
        order == "desc",
        lambda stored: listed(stored.metadata, stored.framing.model, of_model=model, wanted=wanted),
    )
    return JSONResponse(list_object(await completions.answers(page), has_more))


@router.get("/{completion_id}")
async def retrieve_chat_completion(stored: Stored, completions: Completions) -> JSONResponse:
    """A stored chat completion, as its answer was, with its metadata."""
    return await _answer(completions, stored)


@router.post("/{completion_id}")
async def update_chat_completion(
    body: MetadataUpdate, stored: Stored, completions: Completions, owner: Owner, services: ServicesDep
) -> JSONResponse:
    """Set a stored chat completion's metadata (the only change OpenAI allows), whole; answers the
    completion."""
    await services.store.annotate(stored.job_id, owner, body.annotations())
    return await _answer(completions, replace(stored, metadata=body.metadata or {}))


@router.delete("/{completion_id}")
async def delete_chat_completion(
    stored: Stored, completions: Completions, owner: Owner, services: ServicesDep
) -> JSONResponse:
    """Delete a stored chat completion (its job's keys) before its retention ends."""
    await services.store.delete(stored.job_id)
    await completions.remove(owner, stored.job_id)
    return JSONResponse(deleted(COMPLETION_PREFIX + stored.job_id))


@router.get("/{completion_id}/messages")
async def list_chat_completion_messages(
    stored: Stored, services: ServicesDep, after: After = None, limit: Limit = 20, order: Order = "asc"
) -> JSONResponse:
    """The messages of a stored chat completion's request, OpenAI's list page."""
    completion_id = COMPLETION_PREFIX + stored.job_id
    messages = store_messages(completion_id, await services.store.own_messages(stored.job_id))
    return JSONResponse(item_list(messages, limit, order == "asc", after))
