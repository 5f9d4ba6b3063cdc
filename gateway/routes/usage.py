"""`GET /v1/usage`: the calling key's tenant, its limits and its counters, as the submit script sees them."""

from __future__ import annotations

from fastapi import APIRouter, Request

from gateway.auth import Owner
from gateway.deps import ServicesDep
from gateway.errors import documented
from shared.tenants import LIMITS, UsageAnswer

router = APIRouter(tags=["usage"], responses=documented(401, 503))


@router.get("/v1/usage", response_model=UsageAnswer)
async def usage(request: Request, owner: Owner, services: ServicesDep) -> UsageAnswer:
    """Only the caller's own tenant: another tenant's figures are not a key's to read."""
    tenant = request.app.state.api_keys.tenants.get(owner)
    if tenant is None:
        return UsageAnswer(
            tenant=None,
            limits=dict.fromkeys(LIMITS),
            weight=None,
            prompt_token_weight=None,
            output_token_weight=None,
            default_priority=None,
            min_priority=None,
            usage=None,
        )
    return UsageAnswer(
        tenant=tenant.name,
        limits=tenant.limits(),
        weight=tenant.weight,
        prompt_token_weight=tenant.prompt_token_weight,
        output_token_weight=tenant.output_token_weight,
        default_priority=tenant.default_priority,
        min_priority=tenant.min_priority,
        usage=await services.store.tenant_usage(tenant.name),
    )
