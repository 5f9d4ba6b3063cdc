"""Signing a webhook as the Standard Webhooks specification asks, so that a receiver checks it with
any of that specification's libraries (`standardwebhooks`, `svix`, the `openai` package's
`client.webhooks.unwrap`).

A delivery carries `webhook-id` (the event's id, the same on every attempt: a receiver drops a
repeat by it), `webhook-timestamp` (unix seconds of the attempt: a receiver refuses an old one, so a
captured request cannot be replayed later) and `webhook-signature`: `v1,` and the base64 HMAC-SHA256
of `<id>.<timestamp>.<body>` under the secret, which is `whsec_` and the key's bytes in base64.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
from dataclasses import dataclass, field

SECRET_PREFIX = "whsec_"
SIGNATURE_VERSION = "v1"
MIN_SECRET_BYTES = 24  # the specification asks for 24 to 64 random bytes


@dataclass(frozen=True)
class WebhookSecret:
    """A key's webhook secret; its bytes never show in a repr or a log."""

    key: bytes = field(repr=False)

    @classmethod
    def parse(cls, text: str) -> WebhookSecret:
        """`whsec_<base64>`, as Standard Webhooks' libraries and OpenAI write secrets; `ValueError` else."""
        if not text.startswith(SECRET_PREFIX):
            raise ValueError(f"a webhook secret starts with {SECRET_PREFIX!r}")
        try:
            key = base64.b64decode(text[len(SECRET_PREFIX) :], validate=True)
        except binascii.Error as exc:
            raise ValueError(f"a webhook secret is base64 after {SECRET_PREFIX!r}: {exc}") from None
        if len(key) < MIN_SECRET_BYTES:
            raise ValueError(f"a webhook secret holds at least {MIN_SECRET_BYTES} bytes (it has {len(key)})")
        return cls(key)

    def sign(self, message_id: str, timestamp: int, body: bytes) -> str:
        signed = f"{message_id}.{timestamp}.".encode() + body
        digest = hmac.new(self.key, signed, hashlib.sha256).digest()
        return f"{SIGNATURE_VERSION},{base64.b64encode(digest).decode()}"


@dataclass(frozen=True)
class KeyWebhook:
    """What an API key's jobs' webhooks go by: the secret that signs them, and the URL they go to
    unless a request names its own."""

    secret: WebhookSecret
    default_url: str | None = None


def signed_headers(secret: WebhookSecret, message_id: str, timestamp: int, body: bytes) -> dict[str, str]:
    """The headers of one delivery attempt of `body`."""
    return {
        "content-type": "application/json",
        "webhook-id": message_id,
        "webhook-timestamp": str(timestamp),
        "webhook-signature": secret.sign(message_id, timestamp, body),
    }
