"""A small typed client of the native job API on httpx: submit, read, follow over SSE, cancel.

Every failure surfaces as one `GatewayError` carrying the gateway's `error_type` and message;
httpx's own errors are translated here, at the boundary.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import httpx

from shared.errors import StreampoolError
from shared.events import TERMINAL_EVENT_TYPES, Event, event_adapter
from shared.requests import CancelAnswer, EventsPage, JobAccepted, JobRecord, JobRequest

TIMEOUT = httpx.Timeout(30.0)
# The gateway sends a keep-alive comment every sse_ping_seconds (15 by default): a stream
# silent for longer than this is dead, and is reopened from its cursor.
STREAM_TIMEOUT = httpx.Timeout(30.0, read=60.0)
# Failures that a later attempt may not meet: no answer, Redis down, a stream cut short.
TRANSIENT = frozenset({"unreachable", "unavailable", "disconnected"})


class GatewayError(StreampoolError):
    """A gateway's error answer (`{error, error_type}`), or no answer at all (`unreachable`)."""

    def __init__(
        self,
        message: str,
        error_type: str,
        status_code: int | None = None,
        detail: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(message)
        self.error_type = error_type
        self.status_code = status_code
        self.detail = detail or {}

    @property
    def transient(self) -> bool:
        return self.error_type in TRANSIENT


def gateway_error(response: httpx.Response) -> GatewayError:
    """The error a non-2xx answer stands for; a body not from the gateway (a proxy's) keeps its status."""
    try:
        body = response.json()
    except ValueError:
        body = None
    if isinstance(body, dict) and isinstance(body.get("error"), str) and "error_type" in body:
        detail = {key: value for key, value in body.items() if key not in ("error", "error_type")}
        return GatewayError(body["error"], str(body["error_type"]), response.status_code, detail)
    return GatewayError(
        f"HTTP {response.status_code} {response.reason_phrase}", "http_error", response.status_code
    )


@contextmanager
def _transport_errors(url: httpx.URL) -> Iterator[None]:
    try:
        yield
    except httpx.TransportError as exc:
        raise GatewayError(f"no answer from {url}: {str(exc) or type(exc).__name__}", "unreachable") from exc


@dataclass(frozen=True)
class ServerSentEvent:
    event: str
    data: str
    id: str | None


def parse_sse(lines: Iterable[str]) -> Iterator[ServerSentEvent]:
    """The events of a `text/event-stream` body, given line by line (the WHATWG parsing rules).

    Unlike a browser's, an event's `id` is the one it carried itself, None if it had none: the
    gateway sends its own failures without one. Comments (keep-alives) and `retry` are skipped,
    and an event cut off before its blank line is dropped.
    """
    event = ""
    data: list[str] = []
    event_id: str | None = None
    for line in lines:
        if not line:
            if data:
                yield ServerSentEvent(event or "message", "\n".join(data), event_id)
            event, data, event_id = "", [], None
            continue
        field, _, value = line.partition(":")
        value = value[1:] if value.startswith(" ") else value
        if field == "data":
            data.append(value)
        elif field == "event":
            event = value
        elif field == "id" and "\0" not in value:
            event_id = value


@dataclass(frozen=True)
class JobEvent:
    """One event of a job and its stream id: the cursor to resume after it."""

    id: str
    event: Event


class Client:
    """The native API of one gateway; `follow` reopens a dropped stream from its cursor by itself."""

    def __init__(
        self,
        base_url: str,
        *,
        api_key: str | None = None,
        reconnects: int = 5,
        reconnect_delay: float = 0.5,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else None
        self._http = httpx.Client(base_url=base_url, timeout=TIMEOUT, transport=transport, headers=headers)
        self.reconnects = reconnects
        self.reconnect_delay = reconnect_delay

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._http.close()

    def _request(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        with _transport_errors(self._http.base_url):
            response = self._http.request(method, path, **kwargs)
        if response.is_error:
            raise gateway_error(response)
        return response

    def submit(self, request: JobRequest, idempotency_key: str | None = None) -> JobAccepted:
        headers = {"Idempotency-Key": idempotency_key} if idempotency_key else {}
        body = request.model_dump(mode="json", exclude_unset=True)
        answer = self._request("POST", "/v1/jobs", json=body, headers=headers)
        return JobAccepted.model_validate_json(answer.content)

    def record(self, job_id: str) -> JobRecord:
        return JobRecord.model_validate_json(self._request("GET", f"/v1/jobs/{job_id}").content)

    def cancel(self, job_id: str) -> CancelAnswer:
        return CancelAnswer.model_validate_json(self._request("POST", f"/v1/jobs/{job_id}/cancel").content)

    def follow(self, job_id: str, after: str | None = None) -> Iterator[JobEvent]:
        """The job's events after `after` (none: from the start) up to the terminal one.

        A stream that drops is reopened with `Last-Event-ID`, so nothing is skipped or repeated;
        after `reconnects` attempts in a row that bring no event, the last failure is raised. A
        cursor already past the terminal event yields nothing.
        """
        cursor, failures = after, 0
        while True:
            try:
                for job_event in self._stream(job_id, cursor):
                    cursor, failures = job_event.id, 0
                    yield job_event
                    if job_event.event.type in TERMINAL_EVENT_TYPES:
                        return
                if self._exhausted(job_id, cursor):
                    return
                raise GatewayError("the event stream closed before the job ended", "disconnected")
            except GatewayError as exc:
                failures += 1
                if not exc.transient or failures > self.reconnects:
                    raise
            time.sleep(self.reconnect_delay * 2 ** (failures - 1))

    def _stream(self, job_id: str, cursor: str | None) -> Iterator[JobEvent]:
        headers = {"Accept": "text/event-stream"}
        if cursor:
            headers["Last-Event-ID"] = cursor
        url = f"/v1/jobs/{job_id}/events"
        with (
            _transport_errors(self._http.base_url),
            self._http.stream("GET", url, headers=headers, timeout=STREAM_TIMEOUT) as response,
        ):
            if response.is_error:
                response.read()
                raise gateway_error(response)
            for sse in parse_sse(response.iter_lines()):
                if sse.id is None:  # the gateway failed mid-stream (Redis, say); its event says why
                    failure = json.loads(sse.data)
                    raise GatewayError(failure["message"], failure["code"])
                yield JobEvent(sse.id, event_adapter.validate_json(sse.data))

    def _exhausted(self, job_id: str, cursor: str | None) -> bool:
        """Whether nothing is left after the cursor: the gateway closes such a stream at once."""
        answer = self._request("GET", f"/v1/jobs/{job_id}/events", params={"after": cursor or "", "limit": 1})
        page = EventsPage.model_validate_json(answer.content)
        return page.done and not page.events
