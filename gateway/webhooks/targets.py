"""Which webhook a job gets, checked before anything is written: the request's own URL, else its
API key's default, and only under a prefix the operator allows (its tenant's own, else the
gateway's), so the gateway never POSTs where no operator said it may (a client cannot point it at
an internal address, nor at another tenant's receiver)."""

from __future__ import annotations

import re
import string
from collections.abc import Mapping, Sequence

import httpx

from gateway.webhooks.signing import KeyWebhook
from shared.errors import WebhookRefused
from shared.tenants import Tenant
from shared.webhooks import API, WEBHOOK_URL

SCHEMES = ("http", "https")
UNRESERVED = frozenset(string.ascii_letters + string.digits + "-._~")
PERCENT_ENCODED = re.compile(r"%(?P<hex>[0-9A-Fa-f]{2})|%")
SLASHES = ("/", "\\")


class WebhooksMisconfigured(Exception):
    """An allowed prefix that is no URL, or a key's default webhook outside the allowed prefixes."""


def _decoded_unreserved(match: re.Match[str]) -> str:
    """One percent-encoding as RFC 3986 6.2.2 normalizes it: an unreserved character decoded, any other
    kept encoded in uppercase; an encoded slash or backslash, or a `%` not followed by two hex digits,
    is refused (a receiver may read either as a separator the prefix check did not see)."""
    if match["hex"] is None:
        raise ValueError("holds a % that is not a percent-encoding")
    char = chr(int(match["hex"], 16))
    if char in SLASHES:
        raise ValueError("must not hold an encoded slash or backslash (%2F, %5C)")
    return char if char in UNRESERVED else f"%{match['hex'].upper()}"


def _without_dot_segments(path: str) -> str:
    """RFC 3986 5.2.4's remove_dot_segments, for an absolute path."""
    kept: list[str] = []
    segments = path.split("/")[1:]
    for position, segment in enumerate(segments):
        last = position == len(segments) - 1
        if segment == "..":
            if kept:
                kept.pop()
            if last:
                kept.append("")
        elif segment == ".":
            if last:
                kept.append("")
        else:
            kept.append(segment)
    return "/" + "/".join(kept)


def normalized_path(raw_path: str) -> str:
    """The path (and query) `raw_path` as a receiver resolves it, so that what the prefix check reads is
    what is sent: unreserved characters percent-decoded, then dot segments resolved
    (`/a/%2e%2e/b` is `/b`), at least `/`. `ValueError` for a backslash or an encoded slash."""
    path, question, query = raw_path.partition("?")
    if "\\" in path:
        raise ValueError("must not hold a backslash")
    return _without_dot_segments(PERCENT_ENCODED.sub(_decoded_unreserved, path or "/")) + question + query


def normalized(url: str) -> str:
    """`url` as it is compared and POSTed to: scheme and host lowercase, the path normalized
    (`normalized_path`), so that the prefix `https://hooks.example.com/` never matches
    `https://hooks.example.com.evil.net/` and `https://hooks.example.com/a/` never matches
    `https://hooks.example.com/a/%2e%2e/b`. `ValueError` for anything but an absolute http(s) URL
    without credentials, or a path that cannot be normalized."""
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
    return f"{parsed.scheme}://{parsed.netloc.decode()}{normalized_path(parsed.raw_path.decode())}"


def _normalized_prefixes(prefixes: Sequence[str], where: str) -> tuple[str, ...]:
    try:
        return tuple(normalized(prefix) for prefix in prefixes)
    except ValueError as exc:
        raise WebhooksMisconfigured(f"{where}: a prefix {exc}") from None


class WebhookTargets:
    """The allowed prefixes and the keys' webhooks: what a job's webhook may be."""

    def __init__(
        self,
        allowed_prefixes: Sequence[str],
        key_webhooks: Mapping[str, KeyWebhook],
        tenants: Mapping[str, Tenant] | None = None,
    ) -> None:
        """`tenants`, by owner id: a key whose tenant gives its own `webhook_allowed_prefixes` is held to
        those instead of the gateway's. `WebhooksMisconfigured` for a prefix that is no URL or a key's
        default outside its prefixes."""
        self.prefixes = _normalized_prefixes(allowed_prefixes, "webhook_allowed_prefixes")
        by_tenant = {
            tenant.name: _normalized_prefixes(
                tenant.webhook_allowed_prefixes, f"tenant {tenant.name}: webhook_allowed_prefixes"
            )
            for tenant in (tenants or {}).values()
            if tenant.webhook_allowed_prefixes is not None
        }
        self.owner_prefixes = {
            owner: by_tenant[tenant.name]
            for owner, tenant in (tenants or {}).items()
            if tenant.name in by_tenant
        }
        self.key_webhooks = key_webhooks
        for owner, webhook in key_webhooks.items():
            if webhook.default_url is not None and self._refusal(owner, webhook.default_url):
                raise WebhooksMisconfigured(
                    f"a key's webhook_url {webhook.default_url} is outside its webhook_allowed_prefixes"
                )

    def _refusal(self, owner: str, url: str) -> str | None:
        """Why `url` may not be a webhook of `owner`'s jobs; None when it may."""
        prefixes = self.owner_prefixes.get(owner, self.prefixes)
        if not prefixes:
            return "webhooks are not enabled for this key (no webhook_allowed_prefixes)"
        try:
            url = normalized(url)
        except ValueError as exc:
            return str(exc)
        if not url.startswith(prefixes):
            return "is not under any of the webhook_allowed_prefixes of this key"
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
        if (refusal := self._refusal(owner, requested)) is not None:
            raise WebhookRefused.of_field(field, refusal)
        if key_webhook is None:
            raise WebhookRefused.of_field(field, "the API key has no webhook_secret to sign webhooks with")
        return {WEBHOOK_URL: normalized(requested), API: api}
