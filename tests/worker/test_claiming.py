"""A worker's claims against the real Redis: what its last claims carried is settled as it stops, so
that the output of the jobs it ended after its last claim is charged to their tenants' shares, and
its load no longer counts among the workers that claim."""

from __future__ import annotations

from shared.config import WorkerSettings
from shared.jobstore import JobStore
from shared.requests import JobRequest
from shared.scheduling import Placement
from shared.tenants import Tenant
from worker.claiming import Claims
from worker.engine import PrefixCache

MODEL = "smol"
WORKER = "worker-settles"


async def test_a_stopping_worker_charges_its_last_jobs_output_and_leaves_the_loads(store: JobStore) -> None:
    tenant = Tenant("settling", output_token_weight=3)
    job = JobRequest(prompt="Hello", max_tokens=8)
    placement = Placement(prompt_tokens=10)
    job_id = (await store.submit(job, model=MODEL, max_queued=0, tenant=tenant, placement=placement)).job_id
    model = store.keys.model(MODEL)
    settings = WorkerSettings(served_model_name=MODEL)
    cache = PrefixCache(block_size=16, blocks=64)
    claims = Claims(store.redis, store.keys, settings, WORKER, cache, lambda: 0)
    try:
        assert await claims(store.redis, read_limit=10, wanted=1, batch_wanted=0) == [
            (job_id, await store.redis.zscore(model.queue, job_id))
        ]
        assert await store.redis.hexists(model.worker_loads, WORKER)
        passed = await store.redis.zscore(model.share_tenants, tenant.name)
        claims.charge(job_id, 7)  # it ended: 7 output tokens, none claimed since
        await claims.settle()
        assert await store.redis.zscore(model.share_tenants, tenant.name) == passed + 7 * 3
        assert not await store.redis.hexists(model.worker_loads, WORKER)
        await claims.settle()  # nothing left to charge
        assert await store.redis.zscore(model.share_tenants, tenant.name) == passed + 7 * 3
    finally:
        await store.redis.delete(store.keys.lease(job_id))
