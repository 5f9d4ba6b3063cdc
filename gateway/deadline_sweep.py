"""The deadline sweep: every gateway ends, every `deadline_sweep_seconds`, the queued jobs whose deadline
has passed, so that a job no worker takes in time (none is live for its model, or all are busy) ends
`deadline_exceeded` all the same, without costing any engine time; a worker that claims one first ends it
the same way (`start.lua`). Gateways sweeping together end each job once: its end is one script
(`expire.lua`), which a second sweeper finds already done. What a sweep reads is one sorted set per known
model, of its queued jobs that have a deadline (`ModelKeys.deadlines`)."""

from __future__ import annotations

import asyncio
import logging

from gateway.admission import Admission
from shared.errors import BackendUnavailable
from shared.jobstore import JobStore

log = logging.getLogger(__name__)


async def sweep_deadlines(store: JobStore, admission: Admission, every_seconds: float) -> None:
    """End the queued jobs past their deadline for as long as the gateway runs; Redis away is waited out."""
    while True:
        try:
            catalog = await admission.catalog()
            if ended := await store.expire_due(catalog.entries):
                log.info("%d queued jobs reached their deadline and failed unrun", ended)
        except BackendUnavailable as exc:
            log.warning("deadlines not swept: %s", exc)
        await asyncio.sleep(every_seconds)
