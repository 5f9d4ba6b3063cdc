"""The API keys file: a plain list (one key per line), or TOML with each key's tenant and webhook.

A file whose name ends in `.toml` holds one `[[keys]]` table per key, and one `[[tenants]]` table
per tenant that has limits (every limit optional; a key names its tenant, several keys may share
one, and a key that names none is a tenant of its own, with the limits of the table named `default`
if there is one)::

    [[tenants]]
    name = "team-a"
    max_queued_jobs = 100        # jobs waiting for a worker
    max_running_jobs = 8         # jobs queued and running together
    requests_per_minute = 600    # jobs admitted in any sliding minute
    tokens_per_minute = 200000   # prompt plus generated tokens of jobs ended in any sliding minute
    weight = 2.0                 # its share of each model's queue, against the others' weights
    prompt_token_weight = 1.0    # what a prompt token counts against its share (default 1)
    output_token_weight = 2.0    # what an output token counts (default 2: decoding costs more)
    default_priority = 0         # a job's priority when it names none (lower runs first, as in vLLM)
    min_priority = 0             # the most urgent priority its jobs may ask for (default: any)
    webhook_allowed_prefixes = ["https://hooks.example.com/team-a/"]  # instead of the gateway's

    [[keys]]
    key = "sk-team-a"
    tenant = "team-a"
    webhook_secret = "whsec_..."                           # signs the webhooks of this key's jobs
    webhook_url = "https://hooks.example.com/streampool"  # optional: the webhook of its jobs by default
    admin = true                  # may load and unload LoRA adapters at run time (default false)

Any other file is the plain list, as before: every key a tenant of its own, without limits.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from gateway.webhooks.signing import WebhookSecret
from shared.requests import MAX_PRIORITY
from shared.tenants import DEFAULT_TENANT, Tenant

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - the same parser, before it joined the standard library
    import tomli as tomllib


TENANT_NAME = r"^[A-Za-z0-9_.-]{1,64}$"  # it names Redis keys and labels metrics


@dataclass(frozen=True)
class KeyEntry:
    """One API key, its tenant's name (None: a tenant of its own), and its webhook's secret and default
    URL where the file gives them."""

    key: str
    webhook_secret: WebhookSecret | None = None
    webhook_url: str | None = None
    tenant: str | None = None
    admin: bool = False  # may change what the workers serve (runtime adapters)


@dataclass(frozen=True)
class KeysFile:
    """What a keys file holds: its keys, and the tenants it gives limits to."""

    keys: list[KeyEntry]
    tenants: list[Tenant]


class _TenantTable(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    name: str = Field(pattern=TENANT_NAME)
    max_queued_jobs: int | None = Field(None, ge=1)
    max_running_jobs: int | None = Field(None, ge=1)
    requests_per_minute: int | None = Field(None, ge=1)
    tokens_per_minute: int | None = Field(None, ge=1)
    weight: float = Field(1.0, gt=0, allow_inf_nan=False)
    prompt_token_weight: float = Field(1.0, ge=0, allow_inf_nan=False)
    output_token_weight: float = Field(2.0, ge=0, allow_inf_nan=False)
    default_priority: int = Field(0, ge=-MAX_PRIORITY, le=MAX_PRIORITY)
    min_priority: int = Field(-MAX_PRIORITY, ge=-MAX_PRIORITY, le=MAX_PRIORITY)
    webhook_allowed_prefixes: tuple[str, ...] | None = Field(None, strict=False)  # a TOML array

    @model_validator(mode="after")
    def _default_within_bound(self) -> _TenantTable:
        if self.default_priority < self.min_priority:
            raise ValueError("default_priority must be at least min_priority")
        return self


class _KeyTable(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    key: str = Field(min_length=1)
    tenant: str | None = Field(None, pattern=TENANT_NAME)
    webhook_secret: str | None = None
    webhook_url: str | None = Field(None, min_length=1)
    admin: bool = False

    @field_validator("webhook_secret")
    @classmethod
    def _secret(cls, value: str | None) -> str | None:
        if value is not None:
            WebhookSecret.parse(value)
        return value

    @model_validator(mode="after")
    def _url_needs_secret(self) -> _KeyTable:
        if self.webhook_url is not None and self.webhook_secret is None:
            raise ValueError("a key with a webhook_url needs a webhook_secret to sign its webhooks")
        return self


class _KeysFile(BaseModel):
    model_config = ConfigDict(extra="forbid")

    keys: list[_KeyTable] = []
    tenants: list[_TenantTable] = []

    @model_validator(mode="after")
    def _tenants_known(self) -> _KeysFile:
        names = [tenant.name for tenant in self.tenants]
        if len(set(names)) < len(names):
            raise ValueError("a tenant is declared twice")
        known = {*names, DEFAULT_TENANT}
        for position, table in enumerate(self.keys):
            if table.tenant is not None and table.tenant not in known:
                raise ValueError(f"keys.{position}.tenant: no [[tenants]] table is named {table.tenant!r}")
        return self


def read_keys_file(path: Path) -> KeysFile:
    """The file's keys and tenants; `OSError` when it cannot be read, `ValueError` (saying where) when
    it is wrong."""
    text = path.read_text()
    if path.suffix != ".toml":
        return KeysFile([KeyEntry(line.strip()) for line in text.splitlines() if line.strip()], [])
    try:
        parsed = _KeysFile.model_validate(tomllib.loads(text))
    except tomllib.TOMLDecodeError as exc:
        raise ValueError(f"{path} is not valid TOML: {exc}") from None
    except ValidationError as exc:
        where = "; ".join(f"{'.'.join(map(str, error['loc']))}: {error['msg']}" for error in exc.errors())
        raise ValueError(f"{path}: {where}") from None
    keys = [
        KeyEntry(
            table.key,
            WebhookSecret.parse(table.webhook_secret) if table.webhook_secret else None,
            table.webhook_url,
            table.tenant,
            table.admin,
        )
        for table in parsed.keys
    ]
    return KeysFile(keys, [Tenant(**table.model_dump()) for table in parsed.tenants])
