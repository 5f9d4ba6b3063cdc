"""Which webhook a job gets, checked before anything is written: the request's own URL, else its
API key's default, and only under a prefix the operator allows, so the gateway never POSTs where
no operator said it may (a client cannot point it at an internal address)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import httpx

from gateway.webhooks.signing import KeyWebhook
from shared.errors import WebhookRefused
from shared.webhooks import API, WEBHOOK_URL

SCHEMES = ("http", "https")


class WebhooksMisconfigured(Exception):
    """An allowed prefix that is no URL, or a key's default webhook outside the allowed prefixes."""


def normalized(url: str) -> str:
    """`url` as it is compared and POSTed to: scheme and host lowercase, the path at least `/`, so that
    the prefix `https://hooks.example.com/` never matches `https://hooks.example.com.evil.net/`.
    `ValueError` for anything but an absolute http(s) URL without credentials."""
    try:
        parsed = httpx.URL(url)
    except httpx.InvalidURL as exc:
        raise ValueError(f"is not a URL ({exc})") from None
    if parsed.scheme not in SCHEMES or not parsed.host:
        raise ValueError("must be an absolute http or https URL")
    if parsed.userinfo:
        raise ValueError("must not hold credentials")
    if parsed.fragment:
        raise ValueError("must not hold a fragment")
    return f"{parsed.scheme}://{parsed.netloc.decode()}{parsed.raw_path.decode() or '/'}"


class WebhookTargets:
    """The allowed prefixes and the keys' webhooks: what a job's webhook may be."""

    def __init__(self, allowed_prefixes: Sequence[str], key_webhooks: Mapping[str, KeyWebhook]) -> None:
        """`WebhooksMisconfigured` for a prefix that is no URL or a key's default outside the prefixes."""
        try:
            self.prefixes = tuple(normalized(prefix) for prefix in allowed_prefixes)
        except ValueError as exc:
            raise WebhooksMisconfigured(f"webhook_allowed_prefixes: a prefix {exc}") from None
        self.key_webhooks = key_webhooks
        for webhook in key_webhooks.values():
            if webhook.default_url is not None and self._refusal(webhook.default_url):
                raise WebhooksMisconfigured(
                    f"a key's webhook_url {webhook.default_url} is outside webhook_allowed_prefixes"
                )

    def _refusal(self, url: str) -> str | None:
        """Why `url` may not be a webhook; None when it may."""
        if not self.prefixes:
            return "webhooks are not enabled on this gateway (no webhook_allowed_prefixes)"
        try:
            url = normalized(url)
        except ValueError as exc:
            return str(exc)
        if not url.startswith(self.prefixes):
            return "is not under any of the gateway's webhook_allowed_prefixes"
        return None

    def annotations(
        self, owner: str, requested: str | None, api: str, field: str = "webhook"
    ) -> dict[str, str]:
        """The annotations a job of `owner` keeps for its webhook (none when it has none): the request's
        URL (`requested`, under its body field `field`), else the key's default; `api` names its events.
        `WebhookRefused`, naming `field`, for a URL that is not allowed or a key without a secret."""
        key_webhook = self.key_webhooks.get(owner)
        if requested is None:
            if key_webhook is None or key_webhook.default_url is None:
                return {}
            return {WEBHOOK_URL: normalized(key_webhook.default_url), API: api}
        if (refusal := self._refusal(requested)) is not None:
            raise WebhookRefused.of_field(field, refusal)
        if key_webhook is None:
            raise WebhookRefused.of_field(field, "the API key has no webhook_secret to sign webhooks with")
        return {WEBHOOK_URL: normalized(requested), API: api}
