"""The claim script's fair sharing of a model's queue among tenants, against the real Redis: a
tenant's backlog delays another tenant's next job by about one job, backlogs are served in
proportion to weights, priority orders the jobs within one tenant's share, and jobs that carry
their prompt's tokens are counted in tokens."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from shared.jobstore import JobStore
from shared.lifecycle.claims import claim
from shared.requests import JobRequest
from shared.scheduling import Placement
from shared.tenants import Tenant
from tests.shared.transitions import claimed

MODEL = "smol"
A, B = Tenant("a"), Tenant("b")


class Queue:
    """One model's queue: submissions by tenant, and claims as a worker makes them, one job each."""

    def __init__(self, store: JobStore) -> None:
        self.store = store
        self.tenant_of: dict[str, str] = {}
        self.claimed: list[str] = []

    async def submit(self, tenant: Tenant | None, count: int = 1, priority: int = 0) -> list[str]:
        ids = []
        for _ in range(count):
            job = JobRequest(prompt="Hello", max_tokens=1, priority=priority)
            job_id = (await self.store.submit(job, model=MODEL, max_queued=0, tenant=tenant)).job_id
            self.tenant_of[job_id] = tenant.name if tenant else "default"
            ids.append(job_id)
        return ids

    async def claim(self, wanted: int = 1) -> list[str]:
        ids = await claimed(self.store, wanted=wanted)
        self.claimed += ids
        return ids

    async def tenants_of_claims(self, count: int) -> list[str]:
        """The tenants of the next `count` jobs claimed one at a time."""
        names = []
        for _ in range(count):
            (job_id,) = await self.claim()
            names.append(self.tenant_of[job_id])
        return names


@pytest.fixture
async def queue(store: JobStore) -> AsyncIterator[Queue]:
    queue = Queue(store)
    yield queue
    if queue.claimed:
        await store.redis.delete(*(store.keys.lease(job_id) for job_id in queue.claimed))


async def test_a_tenant_that_joins_a_backlog_is_served_next(queue: Queue) -> None:
    await queue.submit(A, 30)
    assert await queue.tenants_of_claims(5) == ["a"] * 5
    (b_job,) = await queue.submit(B)
    assert await queue.claim() == [b_job]
    assert await queue.tenants_of_claims(3) == ["a"] * 3


async def test_backlogs_are_served_in_proportion_to_weights(queue: Queue) -> None:
    heavy = Tenant("a", weight=3.0)
    await queue.submit(heavy, 40)
    await queue.submit(B, 40)
    served = await queue.tenants_of_claims(40)
    assert served.count("a") == 30 and served.count("b") == 10
    # Never more than one turn of `b` behind its share, at any point of the sequence.
    for done in range(1, 41):
        assert abs(served[:done].count("b") - done / 4) <= 1, served


async def test_one_claim_of_many_jobs_takes_them_in_turn(queue: Queue) -> None:
    await queue.submit(A, 10)
    await queue.submit(B, 10)
    taken = await queue.claim(wanted=6)
    assert [queue.tenant_of[job_id] for job_id in taken].count("b") == 3


async def test_priority_orders_a_tenants_jobs_and_only_its_own(queue: Queue) -> None:
    (late,) = await queue.submit(A, priority=5)
    (usual,) = await queue.submit(A)
    (urgent,) = await queue.submit(A, priority=-5)
    (b_job,) = await queue.submit(B, priority=10)  # another tenant's: its turn comes all the same
    order = [await queue.claim() for _ in range(4)]
    assert order == [[urgent], [b_job], [usual], [late]]


async def test_a_tenant_back_from_a_pause_has_saved_no_turns(queue: Queue) -> None:
    await queue.submit(A, 20)
    await queue.submit(B, 1)
    assert sorted(await queue.tenants_of_claims(2)) == ["a", "b"]
    await queue.tenants_of_claims(10)  # b has nothing queued meanwhile
    await queue.submit(B, 5)
    assert await queue.tenants_of_claims(6) == ["b", "a", "b", "a", "b", "a"]


async def test_jobs_of_no_tenant_share_the_default_tenants_turns(queue: Queue) -> None:
    await queue.submit(None, 10)
    (a_job,) = await queue.submit(A)
    served = await queue.tenants_of_claims(3)
    assert served.count("a") == 1 and queue.claimed.index(a_job) <= 1


async def test_jobs_that_left_the_queue_leave_their_share(queue: Queue, store: JobStore) -> None:
    cancelled = await queue.submit(A, 2)
    stale, kept = await queue.submit(A, 2)
    for job_id in cancelled:
        await store.cancel(job_id)  # the cancel script takes the entry out
    share = store.keys.model(MODEL).share_queue_prefix + "a"
    assert await store.redis.zcard(share) == 2
    await store.redis.zrem(store.keys.model(MODEL).queue, stale)  # gone without a script, as by expiry
    assert await queue.claim(wanted=5) == [kept]
    assert await store.redis.zcard(share) == 1  # the claim dropped the stale entry; `kept` waits to start
    assert await store.start(kept, "worker-1", MODEL, lease_seconds=6.0) is not None
    assert await store.redis.zcard(share) == 0


async def test_a_queued_job_in_no_share_is_still_taken(queue: Queue, store: JobStore) -> None:
    (job_id,) = await queue.submit(A)
    await store.redis.delete(store.keys.model(MODEL).share_queue_prefix + "a")
    assert await queue.claim() == [job_id]


async def test_a_job_claimed_by_another_worker_is_passed_over(queue: Queue, store: JobStore) -> None:
    first, second = await queue.submit(A, 2)
    assert await claimed(store, worker="another-worker") == [first]
    queue.claimed.append(first)  # for the cleanup
    assert await queue.claim(wanted=5) == [second]


async def test_a_queued_jobs_position_counts_only_its_own_tenants_jobs_before_it(
    queue: Queue, store: JobStore
) -> None:
    usual = await queue.submit(A, 3)
    (urgent,) = await queue.submit(A, priority=-1)
    (b_job,) = await queue.submit(B)

    async def position(job_id: str) -> int:
        rank = (await store.record(job_id)).queue_position
        assert rank is not None
        return rank

    assert await position(urgent) == 0 and await position(b_job) == 0
    # by age, then (two in one millisecond) by id: each has its own place after the urgent one
    assert sorted([await position(job_id) for job_id in usual]) == [1, 2, 3]


async def test_shares_count_prompt_and_output_tokens(store: JobStore) -> None:
    """A tenant of long jobs and one of short jobs, equal weights, both with backlogs: each is served
    about the same weighted tokens (prompt tokens once claimed, output tokens, twice, once ended),
    as the virtual token counter serves them, where counting jobs would give the short one a few."""
    # Prompt and output tokens; not in proportion, so that a share counting prompts alone fails too.
    shapes = {"long": (400, 300), "short": (20, 5)}
    tenant_of: dict[str, str] = {}
    for name, count in (("long", 30), ("short", 800)):
        prompt, _ = shapes[name]
        for _ in range(count):
            job = JobRequest(prompt="Hello", max_tokens=1)
            placement = Placement(prompt_tokens=prompt)
            submitted = await store.submit(
                job, model=MODEL, max_queued=0, tenant=Tenant(name), placement=placement
            )
            tenant_of[submitted.job_id] = name
    served = dict.fromkeys(shapes, 0)
    charges: list[tuple[str, int]] = []
    while served["long"] < 20 * 1000:
        taken = await claim(
            store.redis,
            keys=store.keys,
            model=store.keys.model(MODEL),
            worker_id="worker-1",
            lease_seconds=60,
            read_limit=100,
            wanted=1,
            charges=charges,
        )
        ((job_id, _),) = taken
        prompt, output = shapes[tenant_of[job_id]]
        served[tenant_of[job_id]] += prompt + 2 * output
        charges = [(job_id, output)]  # it ended: its output is charged at the next claim
    assert 1 / 1.15 <= served["long"] / served["short"] <= 1.15, served
