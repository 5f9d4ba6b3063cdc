"""The console: a page at `GET /console` (served to anyone, as the playground is: it asks for a key),
and the JSON it polls, which needs an admin key or the metrics token.

The page reads `GET /v1/console/snapshot` at most once a second (the gateway reads Redis for it at
most once a second, whatever the number of consoles), the job list with its filters, a job's record
and cancels any job: an operator's view, not an owner's.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Query, Request, Response
from fastapi.responses import FileResponse
from fastapi.security.utils import get_authorization_scheme_param

from gateway.auth import ApiKeys
from gateway.console import Console, JobFilter, JobList, Snapshot, job_owner
from gateway.deps import JobIdPath, ServicesDep, checked_job_id, services_of
from gateway.errors import documented
from gateway.relay.polls import CURSOR_MAX_LENGTH, LIMIT_DEFAULT
from gateway.routes.jobs import cancel_job, job_events
from gateway.routes.playground import asset, static_file
from shared.errors import Forbidden, Unauthorized
from shared.events import JobState
from shared.requests import CancelAnswer, JobRecord

ASSETS = {"console.js": "text/javascript", "console.css": "text/css"}
MAX_LIMIT = 500


async def console_access(request: Request) -> bool:
    """The metrics token, or an admin key (any caller where the gateway asks for no key); whether it was
    an admin's (or no key was asked for): the metrics token reads, and changes nothing."""
    scheme, token = get_authorization_scheme_param(request.headers.get("Authorization"))
    presented = token if scheme.lower() == "bearer" and token else None
    api_keys: ApiKeys = request.app.state.api_keys
    try:
        if api_keys.operator(presented):
            return False
    except Unauthorized:
        pass  # not the metrics token: an API key, perhaps
    owner = api_keys.owner(presented)
    if api_keys.required and owner not in api_keys.admins:
        raise Forbidden(
            "the console needs an admin key (`admin = true` in the keys file) or the metrics token"
        )
    return True


async def console_admin(admin: Annotated[bool, Depends(console_access)]) -> None:
    """For what changes a job: an admin key (or no key asked for), not the metrics token."""
    if not admin:
        raise Forbidden("cancelling a job needs an admin key: the metrics token only reads")


async def _console(request: Request) -> Console:
    """The gateway's one console state, made at its first use."""
    console: Console | None = getattr(request.app.state, "console", None)
    if console is None:
        console = Console(services_of(request), request.app.state.api_keys.tenants)
        request.app.state.console = console
    return console


ConsoleDep = Annotated[Console, Depends(_console)]

page = APIRouter(tags=["console"], include_in_schema=False)
router = APIRouter(
    prefix="/v1/console",
    tags=["console"],
    dependencies=[Depends(console_access)],
    responses=documented(401, 403, 503),
)


@page.get("/console")
async def console_page() -> FileResponse:
    """The console page."""
    return static_file("console.html", "text/html")


@page.get("/console/{name}")
async def console_asset(name: str) -> FileResponse:
    """The page's script or stylesheet."""
    return asset(name, ASSETS, "console")


@router.get("/snapshot", response_model=Snapshot)
async def snapshot(console: ConsoleDep) -> Snapshot:
    """Workers, queues, tenants and batches under way, as read at most a second ago."""
    return await console.snapshot.get()


@router.get("/jobs", response_model=JobList)
async def jobs(
    console: ConsoleDep,
    state: JobState | None = None,
    model: Annotated[str | None, Query(max_length=256)] = None,
    tenant: Annotated[str | None, Query(max_length=256)] = None,
    max_age: Annotated[float | None, Query(gt=0, description="seconds since submission")] = None,
    limit: Annotated[int, Query(ge=1, le=MAX_LIMIT)] = 50,
) -> JobList:
    """The newest jobs that match, newest first, from the job index (`job_index_size` newest jobs), as
    read at most a second ago."""
    return await console.jobs(JobFilter(state, model, tenant, max_age, limit))


@router.get("/jobs/{job_id}", response_model=JobRecord, responses=documented(404))
async def job(job_id: JobIdPath, services: ServicesDep) -> JobRecord:
    """Any job's record, its output so far included while it runs."""
    return await services.store.record(checked_job_id(job_id))


@router.get("/jobs/{job_id}/events", responses=documented(404, 410))
async def events(
    job_id: JobIdPath,
    request: Request,
    services: ServicesDep,
    after: Annotated[
        str | None, Query(max_length=CURSOR_MAX_LENGTH, description="stream id to read after")
    ] = None,
) -> Response:
    """Any job's events, as its owner's `GET /v1/jobs/{id}/events` gives them (and counted among its
    owner's readers): SSE from `after` (from the start: its replay) to its end, or one page of JSON."""
    job_id = checked_job_id(job_id)
    owner = await job_owner(services.redis, services.keys, job_id)
    return await job_events(
        job_id, owner, request, services, after=after, wait=0.0, limit=LIMIT_DEFAULT, last_event_id=None
    )


@router.post(
    "/jobs/{job_id}/cancel",
    dependencies=[Depends(console_admin)],
    status_code=202,
    response_model=CancelAnswer,
    responses={200: {"model": CancelAnswer, "description": "the job had already ended"}, **documented(404)},
)
async def cancel(job_id: JobIdPath, services: ServicesDep, response: Response) -> CancelAnswer:
    """Cancel any job, as its owner's `POST /v1/jobs/{id}/cancel` does."""
    return await cancel_job(checked_job_id(job_id), services, response)
