"""`bench.step_limit` on the real Redis: the step calls it sends are taken, and it leaves nothing behind."""

from __future__ import annotations

import uuid

import redis

from bench.redis_probe import Probe
from bench.step_limit import measure


def test_the_step_limit_counts_every_job_step_and_deletes_what_it_made(redis_url: str) -> None:
    client = redis.Redis.from_url(redis_url, decode_responses=True)
    prefix = f"test-step-limit-{uuid.uuid4().hex[:8]}"
    limit = measure(Probe(client), prefix, jobs=8, calls=5)
    assert limit.requests == 40
    assert limit.per_second > 0
    assert list(client.scan_iter(f"{prefix}:*")) == []
