"""The idempotency key's record, as the submit script keeps it: the job and the request's digest."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from shared.errors import IdempotencyMismatch
from shared.jobstore import JobStore
from shared.requests import JobRequest

REQUEST = JobRequest(prompt="The capital of France is", max_tokens=8)
MODEL = "smol"


async def test_another_request_under_the_key_is_refused_before_anything_is_written(
    store_factory: Callable[..., JobStore],
) -> None:
    store = store_factory()
    first = await store.submit(REQUEST, model=MODEL, idempotency_key="k", max_queued=0)
    with pytest.raises(IdempotencyMismatch):
        await store.submit(
            REQUEST.model_copy(update={"max_tokens": 9}), model=MODEL, idempotency_key="k", max_queued=0
        )
    again = await store.submit(REQUEST, model=MODEL, idempotency_key="k", max_queued=0)
    assert (again.job_id, again.created) == (first.job_id, False)
    assert await store.redis.zcard(store.keys.model(MODEL).queue) == 1


async def test_a_key_kept_without_a_digest_replays_its_job_for_any_request(
    store_factory: Callable[..., JobStore],
) -> None:
    """A key written before digests were kept names its job alone: it still replays, as it did."""
    store = store_factory()
    first = await store.submit(REQUEST, model=MODEL, max_queued=0)
    await store.redis.set(store.keys.idempotency("old"), first.job_id, ex=60)
    again = await store.submit(
        REQUEST.model_copy(update={"max_tokens": 9}), model=MODEL, idempotency_key="old", max_queued=0
    )
    assert (again.job_id, again.created) == (first.job_id, False)
