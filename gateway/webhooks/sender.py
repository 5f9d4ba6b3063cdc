"""The webhook sender: one per gateway process, a background task of the app's lifespan.

It takes ended jobs' webhooks from the webhooks stream (new ones, and those of a gateway that went
away) and POSTs each signed event. Workers play no part: a job's end is announced by the lifecycle
script that ends it, and any gateway delivers it.

Sending is bounded twice: `webhook_max_in_flight` POSTs at once in all, and
`webhook_max_in_flight_per_tenant` for one tenant's jobs, taken in turn across the tenants that have
deliveries ready; so a tenant whose receiver is slow or failing delays only its own deliveries. A
delivery waiting for its retry holds no slot and no task: it is a timer of the event loop, due when
its wait ends. What is retried, and how often, is `retried` and `retry_gap` below. A tenant has at
most `webhook_max_pending_per_tenant` deliveries under way across all gateways, beyond which its own
oldest are given up as the sender holds its newer ones: a tenant whose receiver fails for long gives
up its own deliveries, never another's.

A receiver that answered 2xx is never sent the event again: the delivery record says so and the
entry leaves the stream in one step. Should a gateway vanish between a receiver's 2xx and that step,
another gateway sends the event again with the same `webhook-id`, by which receivers drop repeats.
"""

from __future__ import annotations

import asyncio
import email.utils
import functools
import logging
import random
import time
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timezone
from typing import Any

import httpx

from gateway.webhooks.deliveries import Announcement, Deliveries
from gateway.webhooks.signing import WebhookSecret, signed_headers
from shared.config import GatewaySettings
from shared.errors import BackendUnavailable
from shared.webhooks import DeliveryStatus

log = logging.getLogger(__name__)

READ_BLOCK_SECONDS = 1.0  # the longest a sender waits on the stream before it sees to its held entries
READ_BATCH = 256  # the most entries one read (or takeover) takes from the stream
REDIS_RETRY_SECONDS = 1.0
USER_AGENT = "streampool-webhooks"
NO_SECRET = "no webhook_secret for the job's API key in this gateway's keys file"
TOO_MANY = "given up: more than webhook_max_pending_per_tenant of its tenant's deliveries were under way"
RETRIED_STATUSES = frozenset({408, 409, 425, 429})
"""Answers that say "later" (timeout, conflict, too early, too many requests); with 5xx and no answer
at all, the only ones retried."""
RETRY_AFTER_STATUSES = frozenset({429, 503})


def retried(status: int | None) -> bool:
    """Whether an attempt without a 2xx is tried again, as Standard Webhooks advises: no answer, a 5xx,
    or one of `RETRIED_STATUSES`. Any other answer (a redirect, which is not followed; a 4xx such as
    404 or 410) is the receiver's refusal, and fails the delivery at once."""
    return status is None or status >= 500 or status in RETRIED_STATUSES


def retry_gap(attempts: int, first: float, longest: float) -> float:
    """The wait after `attempts` failed attempts: doubling from `first` up to `longest`, of which the
    last half is random, so that the retries of many webhooks of one receiver spread out."""
    gap: float = min(first * 2.0 ** (attempts - 1), longest)
    return gap / 2 + random.uniform(0, gap / 2)


def asked_wait(status: int | None, retry_after: str | None, now: float) -> float | None:
    """The wait a 429 or 503 asks for by its `Retry-After` (seconds, or an HTTP date); None else."""
    if status not in RETRY_AFTER_STATUSES or not retry_after:
        return None
    if retry_after.strip().isdigit():
        return float(retry_after)
    try:
        when = email.utils.parsedate_to_datetime(retry_after)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:  # an HTTP date is GMT
        when = when.replace(tzinfo=timezone.utc)
    return max(0.0, when.timestamp() - now)


@dataclass(frozen=True)
class Answer:
    """What one attempt got: the receiver's status (None: no answer), what went wrong, its Retry-After."""

    status: int | None
    error: str | None = None
    retry_after: str | None = None

    @property
    def delivered(self) -> bool:
        return self.status is not None and 200 <= self.status < 300


@dataclass(eq=False)
class Held:
    """A delivery this sender holds: to send, sending, or waiting for its retry."""

    announcement: Announcement
    tenant: str
    attempts: int
    timer: asyncio.TimerHandle | None = field(default=None, repr=False)


class WebhookSender:
    """Delivers the webhooks this gateway takes from the stream, within its sending slots."""

    def __init__(
        self,
        deliveries: Deliveries,
        secrets: Callable[[str], WebhookSecret | None],
        tenant_of: Callable[[str], str],
        settings: GatewaySettings,
        http: httpx.AsyncClient,
        consumer: str,
    ) -> None:
        self.deliveries = deliveries
        self.secrets = secrets
        self.tenant_of = tenant_of
        self.settings = settings
        self.http = http
        self.consumer = consumer
        self._held: dict[str, Held] = {}
        self._ready: dict[str, deque[Held]] = {}  # by tenant, in the order they take turns
        self._sending: dict[str, asyncio.Task[None]] = {}
        self._sending_of: Counter[str] = Counter()  # by tenant
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
                block_ms = int(self._sweep_every * 1000)
                await self._hold(await self.deliveries.read_new(self.consumer, READ_BATCH, block_ms))
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
            # Taken over by another gateway, given up, or finished meanwhile by its own attempt.
            if self._forget(entry_id):
                log.warning("webhooks: entry %s is no longer this gateway's", entry_id)
        idle_ms = int(self.settings.webhook_takeover_seconds * 1000)
        self._cursor, taken = await self.deliveries.take_over(
            self.consumer, idle_ms, READ_BATCH, self._cursor
        )
        await self._hold(taken)

    async def _hold(self, entries: list[Announcement | str]) -> None:
        """Hold the entries read, each due at once or when the wait its record names ends, and let go
        of those given up past their tenant's bound (other gateways' sweeps find theirs gone)."""
        new: list[tuple[Announcement, str]] = []
        for entry in entries:
            if isinstance(entry, str):
                log.error("webhooks: entry %s is no announcement; dropped", entry)
                await self.deliveries.drop(entry)
            elif entry.entry_id not in self._held:
                new.append((entry, self.tenant_of(entry.owner)))
        if not new:
            return
        holding = await self.deliveries.hold(new, self.settings.webhook_max_pending_per_tenant, TOO_MANY)
        given_up = set(holding.given_up)
        for entry_id in given_up:
            self._forget(entry_id)
        if given_up:
            log.warning(
                "webhooks: %d deliveries given up: webhook_max_pending_per_tenant reached", len(given_up)
            )
        for (announcement, tenant), so_far in zip(new, holding.progress, strict=True):
            if so_far is not None and announcement.entry_id not in given_up:
                held = Held(announcement, tenant, so_far.attempts)
                self._held[announcement.entry_id] = held
                self._due_at(held, so_far.next_attempt_at)

    def _due_at(self, held: Held, at: float) -> None:
        delay = at - time.time()
        if delay <= 0:
            self._ready_now(held)
        else:
            held.timer = asyncio.get_running_loop().call_later(delay, self._ready_now, held)

    def _ready_now(self, held: Held) -> None:
        held.timer = None
        if self._held.get(held.announcement.entry_id) is held:
            self._ready.setdefault(held.tenant, deque()).append(held)
            self._dispatch()

    def _dispatch(self) -> None:
        """Start what is ready while slots are free: one delivery per tenant in turn, none for a tenant
        at its own bound."""
        most, most_each = self.settings.webhook_max_in_flight, self.settings.webhook_max_in_flight_per_tenant
        started = True
        while started and self._ready and len(self._sending) < most:
            started = False
            for tenant in list(self._ready):
                if len(self._sending) >= most:
                    return
                if self._sending_of[tenant] >= most_each:
                    continue
                queue = self._ready.pop(tenant)
                held = queue.popleft()
                if queue:
                    self._ready[tenant] = queue  # to the end of the turn
                if self._held.get(held.announcement.entry_id) is held:
                    self._start(held)
                started = True

    def _start(self, held: Held) -> None:
        entry_id = held.announcement.entry_id
        task = asyncio.create_task(self._attempt(held), name=f"webhook {entry_id}")
        self._sending[entry_id] = task
        self._sending_of[held.tenant] += 1
        task.add_done_callback(functools.partial(self._sent, held))

    def _sent(self, held: Held, task: asyncio.Task[None]) -> None:
        entry_id = held.announcement.entry_id
        if self._sending.get(entry_id) is task:
            del self._sending[entry_id]
        self._sending_of[held.tenant] -= 1
        if not self._sending_of[held.tenant]:
            del self._sending_of[held.tenant]
        if not task.cancelled() and task.exception() is not None:
            # Let go (any takeover sweep tries it again once it idles), so no fault leaves it held.
            log.error("webhooks: entry %s failed", entry_id, exc_info=task.exception())
            self._forget(entry_id)
        self._dispatch()

    def _forget(self, entry_id: str) -> bool:
        """Stop holding the entry (it stays pending in the group unless finished); False if not held."""
        held = self._held.pop(entry_id, None)
        if held is None:
            return False
        if held.timer is not None:
            held.timer.cancel()
        if (task := self._sending.get(entry_id)) is not None and task is not asyncio.current_task():
            task.cancel()
        return True

    async def close(self) -> None:
        """Stop every delivery this sender holds (they stay pending, for another gateway to take over)."""
        for entry_id in list(self._held):
            self._forget(entry_id)
        await asyncio.gather(*self._sending.values(), return_exceptions=True)
        try:
            await self.deliveries.leave(self.consumer)
        except BackendUnavailable as exc:
            log.warning("webhooks: could not leave the consumer group: %s", exc.message)

    async def _attempt(self, held: Held) -> None:
        """One attempt; then the delivery is finished, let go, or due again later."""
        entry_id = held.announcement.entry_id
        try:
            next_at = await self._try(held)
        except BackendUnavailable as exc:
            # Let go, left pending: this gateway's own takeover sweep tries it again once it idles.
            log.warning("webhooks: job %s: %s", held.announcement.job_id, exc.message)
            next_at = None
        if next_at is None:
            self._forget(entry_id)
        elif self._held.get(entry_id) is held:
            self._due_at(held, next_at)

    async def _try(self, held: Held) -> float | None:
        """Send once and record how it went: when to try again, or None when not (finished, or let go)."""
        announcement = held.announcement
        give_up_at = announcement.ended_at + self.settings.webhook_retry_for_seconds
        secret = self.secrets(announcement.owner)
        if secret is None:
            if time.time() > give_up_at:
                await self.deliveries.finished(
                    announcement,
                    held.tenant,
                    {"status": DeliveryStatus.failed.value, "last_error": NO_SECRET},
                )
                return None
            # Another gateway's keys file may know the key (a new one being rolled out): the entry is
            # let go, not acknowledged, and any gateway's takeover sweep takes it once it idles.
            await self.deliveries.attempted(announcement, {"last_error": NO_SECRET})
            return None
        event = announcement.event()
        held.attempts += 1
        answer = await self._post(announcement.url, secret, event.id, event.model_dump_json().encode())
        now = time.time()
        outcome: dict[str, Any] = {
            "attempts": held.attempts,
            "last_status": answer.status,
            "last_error": answer.error,
            "last_attempt_at": now,
        }
        extra = {"job_id": announcement.job_id}
        if answer.delivered:
            outcome |= {
                "status": DeliveryStatus.delivered.value,
                "delivered_at": now,
                "next_attempt_at": None,
            }
            await self.deliveries.finished(announcement, held.tenant, outcome)
            log.info("webhook %s delivered", event.type, extra=extra)
            return None
        longest = self.settings.webhook_max_retry_gap_seconds
        wait = retry_gap(held.attempts, self.settings.webhook_first_retry_seconds, longest)
        if (asked := asked_wait(answer.status, answer.retry_after, now)) is not None:
            wait = min(max(wait, asked), longest)
        if not retried(answer.status) or now + wait > give_up_at:
            outcome |= {"status": DeliveryStatus.failed.value, "next_attempt_at": None}
            await self.deliveries.finished(announcement, held.tenant, outcome)
            log.warning("webhook %s given up after %d attempts", event.type, held.attempts, extra=extra)
            return None
        await self.deliveries.attempted(announcement, outcome | {"next_attempt_at": now + wait})
        return now + wait

    async def _post(self, url: str, secret: WebhookSecret, message_id: str, body: bytes) -> Answer:
        """One attempt: the receiver's answer, or what kept it from answering."""
        headers = signed_headers(secret, message_id, int(time.time()), body) | {"user-agent": USER_AGENT}

        async def send() -> Answer:
            # The answer's body is never read: its status (and Retry-After) is all a delivery needs.
            async with self.http.stream("POST", url, content=body, headers=headers) as response:
                status = response.status_code
                error = None if 200 <= status < 300 else f"answered {status}"
                return Answer(status, error, response.headers.get("retry-after"))

        try:
            # httpx bounds each phase; this bounds the whole, a receiver that answers drop by drop included
            return await asyncio.wait_for(send(), self.settings.webhook_timeout_seconds)
        except (httpx.HTTPError, asyncio.TimeoutError) as exc:
            return Answer(None, f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__)
