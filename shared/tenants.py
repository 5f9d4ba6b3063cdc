"""Tenants: who shares an API key's limits, what the limits are, and a tenant's usage as Redis holds it.

A tenant's counters are kept by the lifecycle scripts, never by a gateway's memory, so every gateway
and worker sees the same figures: the tenant's queued jobs (a sorted set scored by when each one's
record would expire, so that a job that expires unstarted stops counting), its running jobs (a set),
its admitted requests and its ended jobs' tokens of the last minute (sorted sets scored by time, a
sliding window: `tenant_admit.lua`), pruned where they are counted.
"""

from __future__ import annotations

from dataclasses import dataclass

from pydantic import BaseModel

from shared.requests import MAX_PRIORITY

DEFAULT_TENANT = "default"
"""The tenant whose table gives its limits to every key that names no tenant (each such key is a tenant
of its own, with those limits), and whose share of a queue the jobs of no tenant take."""

WINDOW_SECONDS = 60
"""The span of `requests_per_minute` and `tokens_per_minute`: a sliding minute, as Redis's clock reads it."""

LIMITS = ("max_queued_jobs", "max_running_jobs", "requests_per_minute", "tokens_per_minute")
"""The limits a tenant may have, under the names a refusal gives."""


@dataclass(frozen=True)
class Tenant:
    """A tenant's name and limits; a limit of None is no limit. `weight` is its share of each model's
    queue against the other tenants' (`claim.lua`); its jobs take `default_priority` unless they
    name one, and may name none more urgent (lower) than `min_priority`; their webhooks may go only
    under its own `webhook_allowed_prefixes` where it has them."""

    name: str
    max_queued_jobs: int | None = None
    max_running_jobs: int | None = None  # queued and running together: see `tenant_admit.lua`
    requests_per_minute: int | None = None
    tokens_per_minute: int | None = None
    weight: float = 1.0
    # What a job costs against the tenant's share, as the virtual token counter counts: each prompt
    # token and each output token, weighted (decoding a token costs more than reading one).
    prompt_token_weight: float = 1.0
    output_token_weight: float = 2.0
    default_priority: int = 0
    # vLLM's order, lower first, negative included: a job's priority orders only its own tenant's share,
    # so that the bound is the operator's to raise (0: no jumping of one's own queue), not a refusal.
    min_priority: int = -MAX_PRIORITY
    webhook_allowed_prefixes: tuple[str, ...] | None = None  # None: the gateway's setting

    def token_costs(self, prompt_tokens: int) -> dict[str, str]:
        """A job's record fields that count it against this tenant's share (`claim.lua`): `cost`, its
        prompt's part of its pass, taken at its claim, and `output_cost`, each output token's, charged
        once it has ended."""
        return {
            "cost": repr(self.prompt_token_weight * prompt_tokens / self.weight),
            "output_cost": repr(self.output_token_weight / self.weight),
        }

    def script_limits(self) -> dict[str, int]:
        """The limits as the submit script reads them (`tenant_admit.lua`): 0 is none."""
        return {limit: getattr(self, limit) or 0 for limit in LIMITS}

    def limits(self) -> dict[str, int | None]:
        return {limit: getattr(self, limit) for limit in LIMITS}


DEFAULT_SHARE = Tenant(DEFAULT_TENANT)
"""Where a job of no tenant stands: in the default tenant's share of the queue, with its bounds."""


class TenantUsage(BaseModel):
    """A tenant's counters now: jobs queued and running, requests admitted and tokens counted in the
    last minute; and tokens and jobs ended since Redis began counting (`Keys.tenant_totals`)."""

    queued_jobs: int
    running_jobs: int
    requests_last_minute: int
    tokens_last_minute: int
    tokens_total: int
    jobs_ended_total: int


class UsageAnswer(BaseModel):
    """`GET /v1/usage`: the calling key's tenant, its limits (null: none) and its counters; `tenant`
    null (and no usage) where the gateway asks for no key."""

    tenant: str | None
    limits: dict[str, int | None]
    weight: float | None
    prompt_token_weight: float | None
    output_token_weight: float | None
    default_priority: int | None
    min_priority: int | None
    window_seconds: int = WINDOW_SECONDS
    usage: TenantUsage | None
