"""The file sweeper: every gateway removes, every `files_sweep_seconds`, the files whose `expires_at`
has come that no one read since (a read of one removes it at once). Gateways sweeping together remove
each file once: its removal is one script, which a second sweeper finds already done."""

from __future__ import annotations

import asyncio
import logging

from gateway.files.store import Files
from shared.errors import BackendUnavailable

log = logging.getLogger(__name__)


async def sweep_expired_files(files: Files, every_seconds: float) -> None:
    """Remove the expired files for as long as the gateway runs; Redis away is waited out."""
    while True:
        try:
            if removed := await files.expire_due():
                log.info("removed %d expired files", removed)
        except BackendUnavailable as exc:
            log.warning("expired files not swept: %s", exc)
        await asyncio.sleep(every_seconds)
