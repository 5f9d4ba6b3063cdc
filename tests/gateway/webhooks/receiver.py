"""A webhook receiver the tests start on loopback: a real HTTP server in a thread of its own, which
checks every delivery's signature with the Standard Webhooks library and can fail the first ones, or
every one."""

from __future__ import annotations

import base64
import json
import secrets
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from standardwebhooks import Webhook, WebhookVerificationError

POLL_SECONDS = 0.05
HELD_SECONDS = 120.0  # the longest a held request waits for `answering` (a test that forgot to set it)
"""How often a receiver's server looks for `shutdown()`: each test's receivers end at once, not within
http.server's default half second."""


def new_secret() -> str:
    """A secret as Standard Webhooks' libraries and OpenAI give them: `whsec_` and 32 random bytes."""
    return "whsec_" + base64.b64encode(secrets.token_bytes(32)).decode()


@dataclass
class Delivery:
    """One request the receiver got: its headers, body, whether its signature held, what it answered."""

    headers: dict[str, str]
    body: bytes
    verified: bool
    status: int
    path: str
    at: float  # when it came, monotonic seconds

    @property
    def event(self) -> dict[str, Any]:
        event: dict[str, Any] = json.loads(self.body)
        return event


@dataclass
class Receiver:
    """What the receiver got, and how it answers: 401 to a signature that does not hold, else 503 to
    the first `failures` (with `retry_after`, if given), then 204; or `status` to every one, if given;
    each answer only once `answering` is set (cleared, it holds every request it gets)."""

    secret: str
    url: str = ""
    failures: int = 0
    status: int | None = None
    retry_after: str | None = None
    deliveries: list[Delivery] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)
    answering: threading.Event = field(default_factory=threading.Event)

    def __post_init__(self) -> None:
        self.answering.set()

    def received(self, path: str, headers: dict[str, str], body: bytes) -> int:
        try:
            Webhook(self.secret).verify(body, headers)
            verified = True
        except WebhookVerificationError:
            verified = False
        with self.lock:
            status = 401 if not verified else self.status or (503 if self.failures > 0 else 204)
            self.failures -= verified and self.status is None and status == 503
            self.deliveries.append(Delivery(headers, body, verified, status, path, time.monotonic()))
            return status

    def got(self) -> list[Delivery]:
        with self.lock:
            return list(self.deliveries)

    def accepted(self) -> list[Delivery]:
        """The deliveries it answered with 2xx."""
        return [delivery for delivery in self.got() if 200 <= delivery.status < 300]


@contextmanager
def receiving(secret: str, failures: int = 0) -> Iterator[Receiver]:
    """A receiver listening at `receiver.url` (`http://127.0.0.1:<port>/hooks/`) until the block ends."""
    receiver = Receiver(secret, failures=failures)

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 (http.server's name)
            body = self.rfile.read(int(self.headers.get("content-length", 0)))
            status = receiver.received(self.path, dict(self.headers.items()), body)
            receiver.answering.wait(HELD_SECONDS)
            self.send_response(status)
            if status == 503 and receiver.retry_after is not None:
                self.send_header("retry-after", receiver.retry_after)
            self.send_header("content-length", "0")
            self.end_headers()

        def log_message(self, format: str, *args: Any) -> None:
            pass  # the test's assertions say what came

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    receiver.url = f"http://127.0.0.1:{server.server_address[1]}/hooks/"
    thread = threading.Thread(
        target=server.serve_forever, kwargs={"poll_interval": POLL_SECONDS}, daemon=True
    )
    thread.start()
    try:
        yield receiver
    finally:
        server.shutdown()
        server.server_close()
        thread.join()
