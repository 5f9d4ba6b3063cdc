"""API keys: who a request comes from, as the owner id its jobs are recorded under, and what each key
comes with (its tenant, and its webhook's secret and default URL, from a TOML keys file:
`gateway.keyfile`); and the operator's metrics token.

Keys are held only as SHA-256 digests, and a presented key is compared with every one of
them in constant time, so neither the keys nor which of them matched leak through timing.
An owner id is a short hash of the key's digest: it names the key without revealing it, and so
does the name of the tenant of its own that a key naming none is.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Annotated

from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from fastapi.security.utils import get_authorization_scheme_param

from gateway.keyfile import KeyEntry, read_keys_file
from gateway.webhooks.signing import KeyWebhook
from shared.config import GatewaySettings
from shared.errors import Forbidden, Unauthorized
from shared.keys import ANONYMOUS_OWNER
from shared.tenants import DEFAULT_TENANT, Tenant

log = logging.getLogger(__name__)

OWNER_ID_LENGTH = 16
KEY_TENANT_PREFIX = "key-"
KEY_TENANT_DIGITS = 12  # 48 bits: two keys of one deployment sharing a tenant by chance is out of reach


class AuthNotConfigured(Exception):
    """Neither API keys nor the explicit choice to run without them."""


def _digest(key: str) -> bytes:
    return hashlib.sha256(key.encode()).digest()


def owner_id(key: str) -> str:
    """The owner id of a key: what its jobs' records keep instead of the key."""
    return hashlib.sha256(b"streampool-owner:" + _digest(key)).hexdigest()[:OWNER_ID_LENGTH]


def key_tenant(key: str) -> str:
    """The name of a key's own tenant, where the key names none: a hash of its digest (under another
    label than its owner id), so that the name shown in `/v1/usage` and in metrics reveals neither
    the key nor its owner id."""
    digits = hashlib.sha256(b"streampool-tenant:" + _digest(key)).hexdigest()[:KEY_TENANT_DIGITS]
    return KEY_TENANT_PREFIX + digits


@dataclass(frozen=True)
class ApiKeys:
    """The configured keys as digests; `digests` empty means every caller is anonymous. `webhooks`:
    by owner id, the keys that have a webhook secret; `tenants`: by owner id, every key's tenant
    (an anonymous caller has none); `metrics_token`: the digest of the operator's metrics token;
    `admins`: the owner ids of the admin keys."""

    digests: tuple[bytes, ...]
    webhooks: Mapping[str, KeyWebhook] = field(default_factory=dict)
    tenants: Mapping[str, Tenant] = field(default_factory=dict)
    metrics_token: bytes | None = None
    admins: frozenset[str] = frozenset()

    @classmethod
    def from_settings(cls, settings: GatewaySettings) -> ApiKeys:
        """The keys of `api_keys` and `api_keys_file`; refuses to run with none unless told to."""
        entries = [KeyEntry(key.strip()) for key in settings.api_keys.split(",")]
        declared = {DEFAULT_TENANT: Tenant(DEFAULT_TENANT)}
        if settings.api_keys_file is not None:
            try:
                keys_file = read_keys_file(settings.api_keys_file)
            except (OSError, ValueError) as exc:
                raise AuthNotConfigured(f"cannot read api_keys_file {settings.api_keys_file}: {exc}") from exc
            entries += keys_file.keys
            declared |= {tenant.name: tenant for tenant in keys_file.tenants}
        digests = tuple(dict.fromkeys(_digest(entry.key) for entry in entries if entry.key))
        webhooks = {
            owner_id(entry.key): KeyWebhook(entry.webhook_secret, entry.webhook_url)
            for entry in entries
            if entry.webhook_secret is not None
        }
        # A key naming no tenant is one of its own, with the `default` table's limits: its usage and
        # its share of a queue are no other key's.
        tenants = {
            owner_id(entry.key): declared[entry.tenant]
            if entry.tenant is not None
            else replace(declared[DEFAULT_TENANT], name=key_tenant(entry.key))
            for entry in entries
            if entry.key
        }
        if digests:
            log.info("API keys required: %d configured", len(digests))
        elif settings.allow_unauthenticated:
            log.warning("no API keys configured: any client may submit, read and cancel any job")
        else:
            raise AuthNotConfigured(
                "no API keys configured. Set STREAMPOOL_API_KEYS (comma-separated) or "
                "STREAMPOOL_API_KEYS_FILE (one key per line), or set STREAMPOOL_ALLOW_UNAUTHENTICATED=true "
                "to run without authentication."
            )
        metrics_token = _digest(settings.metrics_token) if settings.metrics_token else None
        admins = frozenset(owner_id(entry.key) for entry in entries if entry.key and entry.admin)
        return cls(digests, webhooks, tenants, metrics_token, admins)

    @property
    def required(self) -> bool:
        return bool(self.digests)

    def owner(self, presented: str | None) -> str:
        """The caller's owner id; `Unauthorized` for a missing or unknown key where keys are required."""
        if not self.required:
            return ANONYMOUS_OWNER
        if not presented:
            raise Unauthorized("an API key is required: send `Authorization: Bearer <key>`")
        candidate = _digest(presented)
        # Every digest is compared, whatever matched before: the time taken says nothing.
        matched = [hmac.compare_digest(candidate, known) for known in self.digests]
        if not any(matched):
            raise Unauthorized("the API key is not valid")
        return owner_id(presented)

    def operator(self, presented: str | None) -> bool:
        """Whether the caller presented the metrics token: no when it presented none or none is set;
        `Unauthorized` for a wrong one, so that a scraper given a stale token is told, not served less."""
        if self.metrics_token is None or not presented:
            return False
        if not hmac.compare_digest(_digest(presented), self.metrics_token):
            raise Unauthorized("the metrics token is not valid")
        return True


_bearer = HTTPBearer(auto_error=False, description="an API key of the gateway")


async def _caller(
    request: Request, credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)]
) -> str:
    api_keys: ApiKeys = request.app.state.api_keys
    try:
        return api_keys.owner(credentials.credentials if credentials else None)
    except Unauthorized:
        if request.method == "POST":  # a submission (or a cancel) refused
            request.app.state.metrics.jobs_rejected.labels(reason="unauthorized").inc()
        raise


async def caller(request: Request) -> str:
    """The caller's owner id as `Owner` resolves it, for a route that resolves its own parameters."""
    return await _caller(request, await _bearer(request))


async def _operator(request: Request) -> bool:
    # Read here rather than through `HTTPBearer`, which would document the route as refusing a
    # request without a token: it serves its other series to anyone.
    scheme, token = get_authorization_scheme_param(request.headers.get("Authorization"))
    api_keys: ApiKeys = request.app.state.api_keys
    return api_keys.operator(token if scheme.lower() == "bearer" else None)


async def _admin(request: Request, owner: Annotated[str, Depends(_caller)]) -> str:
    api_keys: ApiKeys = request.app.state.api_keys
    if api_keys.required and owner not in api_keys.admins:
        raise Forbidden("this route needs an admin key (`admin = true` in the keys file)")
    return owner


Owner = Annotated[str, Depends(_caller)]
"""The owner id of the calling key (`anonymous` where no key is required)."""

REQUIRE_KEY = Depends(_caller)
"""For routes and routers that need a key but not who holds it."""

REQUIRE_ADMIN = Depends(_admin)
"""For routes that change what the workers serve: an admin key, where keys are required (without keys,
any caller, as vLLM's server without `--api-key`)."""

Operator = Annotated[bool, Depends(_operator)]
"""Whether the caller is the operator (it sent the metrics token)."""
