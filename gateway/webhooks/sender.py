"""The webhook sender: one per gateway process, a background task of the app's lifespan.

It takes ended jobs' webhooks from the webhooks stream (new ones, and those of a gateway that went
away), POSTs each signed event, and retries one that gets no 2xx with exponential backoff until
`webhook_retry_for_seconds` after its job's end. Workers play no part: a job's end is announced by
the lifecycle script that ends it, and any gateway delivers it.

A receiver that answered 2xx is never sent the event again: the delivery record says so and the
entry leaves the stream in one step. Should a gateway vanish between a receiver's 2xx and that step,
another gateway sends the event again with the same `webhook-id`, by which receivers drop repeats.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import random
import time
from collections.abc import Callable

import httpx

from gateway.webhooks.deliveries import Announcement, Deliveries
from gateway.webhooks.signing import WebhookSecret, signed_headers
from shared.config import GatewaySettings
from shared.errors import BackendUnavailable
from shared.webhooks import DeliveryStatus

log = logging.getLogger(__name__)

READ_BLOCK_SECONDS = 1.0  # the longest a sender waits on the stream before it sees to its held entries
REDIS_RETRY_SECONDS = 1.0
USER_AGENT = "streampool-webhooks"
NO_SECRET = "no webhook_secret for the job's API key in this gateway's keys file"


def retry_gap(attempts: int, first: float, longest: float) -> float:
    """The wait after `attempts` failed attempts: doubling from `first` up to `longest`, of which the
    last half is random, so that the retries of many webhooks of one receiver spread out."""
    gap: float = min(first * 2.0 ** (attempts - 1), longest)
    return gap / 2 + random.uniform(0, gap / 2)


class WebhookSender:
    """Delivers the webhooks this gateway takes from the stream, `webhook_max_in_flight` at a time."""

    def __init__(
        self,
        deliveries: Deliveries,
        secrets: Callable[[str], WebhookSecret | None],
        settings: GatewaySettings,
        http: httpx.AsyncClient,
        consumer: str,
    ) -> None:
        self.deliveries = deliveries
        self.secrets = secrets
        self.settings = settings
        self.http = http
        self.consumer = consumer
        self._held: dict[str, asyncio.Task[None]] = {}
        self._sweep_every = min(settings.webhook_takeover_seconds / 3, READ_BLOCK_SECONDS)
        self._cursor = "0-0"

    async def run(self) -> None:
        """Until cancelled; Redis failures pause it, never end it."""
        joined, next_sweep = False, 0.0
        while True:
            try:
                if not joined:
                    joined = await self.deliveries.join()
                    if not joined:
                        await asyncio.sleep(READ_BLOCK_SECONDS)
                        continue
                if time.monotonic() >= next_sweep:
                    await self._sweep()
                    next_sweep = time.monotonic() + self._sweep_every
                free = self.settings.webhook_max_in_flight - len(self._held)
                if free <= 0:
                    await asyncio.sleep(self._sweep_every)
                    continue
                block_ms = int(self._sweep_every * 1000)
                self._hold(await self.deliveries.read_new(self.consumer, free, block_ms))
            except BackendUnavailable as exc:
                log.warning("webhooks: %s", exc.message)
                joined = False  # a Redis that restarted empty lost the group too
                await asyncio.sleep(REDIS_RETRY_SECONDS)
            except Exception:  # a fault of the sender must not end every later delivery of this gateway
                log.exception("webhooks: the sender failed; it goes on")
                await asyncio.sleep(REDIS_RETRY_SECONDS)

    async def _sweep(self) -> None:
        """Keep what this sender holds from being taken over, and take over what a gone sender held."""
        for entry_id in await self.deliveries.keep(self.consumer, list(self._held)):
            # Taken over by another gateway, or finished (acknowledged) meanwhile by its own task.
            task = self._held.pop(entry_id, None)
            if task is not None and not task.done():
                log.warning("webhooks: another gateway took over entry %s", entry_id)
                task.cancel()
        free = self.settings.webhook_max_in_flight - len(self._held)
        if free > 0:
            idle_ms = int(self.settings.webhook_takeover_seconds * 1000)
            self._cursor, taken = await self.deliveries.take_over(self.consumer, idle_ms, free, self._cursor)
            self._hold(taken)

    def _hold(self, entries: list[Announcement | str]) -> None:
        for entry in entries:
            entry_id = entry if isinstance(entry, str) else entry.entry_id
            if entry_id in self._held:
                continue
            task = asyncio.create_task(self._deliver(entry), name=f"webhook {entry_id}")
            self._held[entry_id] = task
            task.add_done_callback(functools.partial(self._let_go, entry_id))

    def _let_go(self, entry_id: str, task: asyncio.Task[None]) -> None:
        if self._held.get(entry_id) is task:  # not one another gateway took over (cancelled, dropped)
            del self._held[entry_id]

    async def close(self) -> None:
        """Stop every delivery this sender holds (they stay pending, for another gateway to take over)."""
        held = list(self._held.values())
        for task in held:
            task.cancel()
        await asyncio.gather(*held, return_exceptions=True)
        try:
            await self.deliveries.leave(self.consumer)
        except BackendUnavailable as exc:
            log.warning("webhooks: could not leave the consumer group: %s", exc.message)

    async def _deliver(self, entry: Announcement | str) -> None:
        try:
            if isinstance(entry, str):
                log.error("webhooks: entry %s is no announcement; dropped", entry)
                await self.deliveries.drop(entry)
                return
            await self._attempts(entry)
        except BackendUnavailable as exc:
            # Left pending: this gateway's own takeover sweep tries it again once it idles.
            log.warning(
                "webhooks: job %s: %s", entry if isinstance(entry, str) else entry.job_id, exc.message
            )

    async def _attempts(self, announcement: Announcement) -> None:
        """Attempt until a 2xx, or until the retry period ends; the record says how each went."""
        progress = await self.deliveries.progress(announcement.job_id)
        if progress.done:
            await self.deliveries.drop(announcement.entry_id)
            return
        event = announcement.event()
        body = event.model_dump_json().encode()
        give_up_at = announcement.ended_at + self.settings.webhook_retry_for_seconds
        attempts, wait = progress.attempts, progress.next_attempt_at - time.time()
        while True:
            if wait > 0:
                await asyncio.sleep(wait)
            secret = self.secrets(announcement.owner)
            if secret is None:
                if time.time() > give_up_at:
                    await self.deliveries.finished(
                        announcement, {"status": DeliveryStatus.failed.value, "last_error": NO_SECRET}
                    )
                    return
                # Another gateway's keys file may know the key (a new one being rolled out): the entry
                # is let go, not acknowledged, and any gateway's takeover sweep takes it once it idles.
                await self.deliveries.attempted(announcement, {"last_error": NO_SECRET})
                return
            attempts += 1
            status, error = await self._post(announcement.url, secret, event.id, body)
            now = time.time()
            outcome = {
                "attempts": attempts,
                "last_status": status,
                "last_error": error,
                "last_attempt_at": now,
            }
            if status is not None and 200 <= status < 300:
                outcome |= {
                    "status": DeliveryStatus.delivered.value,
                    "delivered_at": now,
                    "next_attempt_at": None,
                }
                await self.deliveries.finished(announcement, outcome)
                log.info("webhook %s delivered", event.type, extra={"job_id": announcement.job_id})
                return
            wait = retry_gap(
                attempts,
                self.settings.webhook_first_retry_seconds,
                self.settings.webhook_max_retry_gap_seconds,
            )
            if now + wait > give_up_at:
                outcome |= {"status": DeliveryStatus.failed.value, "next_attempt_at": None}
                await self.deliveries.finished(announcement, outcome)
                log.warning(
                    "webhook %s given up after %d attempts",
                    event.type,
                    attempts,
                    extra={"job_id": announcement.job_id},
                )
                return
            await self.deliveries.attempted(announcement, outcome | {"next_attempt_at": now + wait})

    async def _post(
        self, url: str, secret: WebhookSecret, message_id: str, body: bytes
    ) -> tuple[int | None, str | None]:
        """One attempt: the receiver's status (None when there was no answer) and what went wrong."""
        headers = signed_headers(secret, message_id, int(time.time()), body) | {"user-agent": USER_AGENT}

        async def send() -> int:
            # The answer's body is never read: its status is all a delivery needs.
            async with self.http.stream("POST", url, content=body, headers=headers) as response:
                return response.status_code

        try:
            # httpx bounds each phase; this bounds the whole, a receiver that answers drop by drop included
            status = await asyncio.wait_for(send(), self.settings.webhook_timeout_seconds)
        except (httpx.HTTPError, asyncio.TimeoutError) as exc:
            return None, f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
        return status, None if 200 <= status < 300 else f"answered {status}"
