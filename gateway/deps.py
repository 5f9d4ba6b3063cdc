"""Request dependencies, declared once: what the lifespan built, handed to the routes."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Annotated

import redis.asyncio as aioredis
from fastapi import Depends, Path, Request

from gateway.admission import Admission
from gateway.auth import Owner
from gateway.batches.store import Batches
from gateway.files.store import Files
from gateway.metrics import GatewayMetrics
from gateway.relay.open_streams import Hold, StreamLimits
from gateway.relay.relay import Relay
from gateway.webhooks.deliveries import Deliveries
from gateway.webhooks.targets import WebhookTargets
from shared.config import GatewaySettings
from shared.errors import JobNotFound
from shared.jobstore import JobStore
from shared.keys import Keys


@dataclass(frozen=True)
class Services:
    """Everything a gateway process shares between requests."""

    settings: GatewaySettings
    keys: Keys
    redis: aioredis.Redis
    store: JobStore
    relay: Relay
    metrics: GatewayMetrics
    admission: Admission
    webhook_targets: WebhookTargets
    deliveries: Deliveries
    files: Files
    batches: Batches

    def hold_reader(self, owner: str) -> Hold:
        """A place among this gateway's open readers for a request that holds its connection open on
        a job (a stream, a wait, a whole answer): 429 at the limits, before any job is made for it."""
        return self.relay.open_streams.hold(owner, StreamLimits.of(self.settings))


def services_of(request: Request) -> Services:
    """What the lifespan built, for the request's route."""
    services: Services = request.app.state.services
    return services


async def _services(request: Request) -> Services:
    """Async, as every dependency here: FastAPI runs a plain function in its thread pool (a hop)."""
    return services_of(request)


ServicesDep = Annotated[Services, Depends(_services)]

JOB_ID = re.compile(r"[0-9a-f]{32}")
"""The one format of a job id: a uuid4's 32 lowercase hex digits, as `JobStore.submit` makes it.

A job's keys are named after its id (`shared.keys`), so an id of any other form could name another
key of the layout (`<id>:events` is the job's stream, not its record): it is unknown before Redis
is asked."""

JobIdPath = Annotated[str, Path(description="job id: 32 lowercase hex digits")]


def checked_job_id(job_id: str) -> str:
    """The job id, if it has the form job ids have; else 404 (see `JOB_ID`)."""
    if not JOB_ID.fullmatch(job_id):
        raise JobNotFound(f"no job {job_id}")
    return job_id


def prefixed_job_id(object_id: str, prefix: str) -> str | None:
    """The job id of an API's object id, `prefix` then a job id (`resp_...`, `chatcmpl-...`); None for
    an id of any other form, which names no job (see `JOB_ID`)."""
    job_id = object_id.removeprefix(prefix)
    return job_id if object_id.startswith(prefix) and JOB_ID.fullmatch(job_id) else None


async def _job_id(job_id: JobIdPath) -> str:
    return checked_job_id(job_id)


async def _owned_job_id(job_id: JobIdPath, owner: Owner, services: ServicesDep) -> str:
    await services.store.check_owner(checked_job_id(job_id), owner)
    return job_id


JobId = Annotated[str, Depends(_job_id)]
"""The path's job id, of the form job ids have; whose it is, the route checks itself (the relay, in
the round trip that reads the stream's state)."""


OwnedJobId = Annotated[str, Depends(_owned_job_id)]
"""The path's job id, once it is known to be the caller's: any other key gets 404 for it."""
