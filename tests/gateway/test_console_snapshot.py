"""What the console's snapshot reads, on the real Redis: each queue's depth, batch band and oldest wait,
each worker's rates from the counters of its heartbeats, and each tenant's usage against its limits (an
in-process gateway with a keys file)."""

from __future__ import annotations

import time
import uuid
from pathlib import Path

from gateway.console import Rates, queue_rows
from shared.jobstore import JobStore
from shared.requests import JobRequest
from shared.workers import WorkerInfo
from tests.conftest import make_settings
from tests.helpers import in_process_gateway
from tests.redis_cleanup import delete_prefix

REQUEST = JobRequest(prompt="Hi", max_tokens=4)


async def test_a_queue_shows_its_depth_its_batch_band_and_its_oldest_wait(store: JobStore) -> None:
    submitted = time.time()
    await store.submit(REQUEST, model="smol", max_queued=0)
    for line in range(2):
        await store.submit(REQUEST, model="smol", max_queued=0, batch=f"batch_{line}")
    now = submitted + 5
    rows = await queue_rows(store.redis, store.keys, ["smol", "idle"], {"smol": 2}, now)
    idle, smol = rows  # by name
    assert (smol.model, smol.workers, smol.queued, smol.batch_queued) == ("smol", 2, 3, 2)
    assert smol.oldest_wait is not None and 4.5 < smol.oldest_wait < 5.01  # the queue scores by ms
    assert (idle.model, idle.workers, idle.queued, idle.batch_queued, idle.oldest_wait) == (
        "idle",
        0,
        0,
        0,
        None,
    )


def heartbeat(at: float, tokens: int, steps: int, worker_id: str = "w1") -> WorkerInfo:
    return WorkerInfo(
        worker_id=worker_id,
        model="smol",
        max_model_len=2048,
        running_jobs=1,
        engine_requests=1,
        generated_tokens=tokens,
        steps=steps,
        started_at=0,
        heartbeat_at=at,
        host="host",
        pid=1,
    )


def test_rates_are_two_heartbeats_difference_over_their_time_apart() -> None:
    rates = Rates()
    assert rates.update([heartbeat(10, 100, 50)]) == {}  # one heartbeat: no rate yet
    assert rates.update([heartbeat(10, 100, 50)]) == {}  # the same one read again
    assert rates.update([heartbeat(12, 300, 60)]) == {"w1": (100.0, 5.0)}
    assert rates.update([heartbeat(12, 300, 60)]) == {"w1": (100.0, 5.0)}  # kept until the next heartbeat
    assert rates.update([heartbeat(14, 300, 60), heartbeat(14, 0, 0, "w2")]) == {"w1": (0.0, 0.0)}
    assert rates.update([heartbeat(16, 10, 1, "w2")]) == {"w2": (5.0, 0.5)}  # w1 gone, and its rate


ADMIN, MEMBER = (f"{name}-{uuid.uuid4().hex}" for name in ("admin", "member"))
TENANTS = f"""
[[tenants]]
name = "team-a"
max_queued_jobs = 5
tokens_per_minute = 1000

[[keys]]
key = "{MEMBER}"
tenant = "team-a"

[[keys]]
key = "{ADMIN}"
admin = true
"""


async def test_the_snapshot_shows_each_tenants_usage_against_its_limits(
    redis_url: str, tmp_path: Path
) -> None:
    keys_file = tmp_path / "keys.toml"
    keys_file.write_text(TENANTS)
    settings = make_settings(redis_url, api_keys_file=keys_file, models=["smol"])
    try:
        async with in_process_gateway(settings) as gateway:
            submitted = await gateway.post(
                "/v1/jobs",
                json={"prompt": "Hi", "max_tokens": 4, "model": "smol"},
                headers={"Authorization": f"Bearer {MEMBER}"},
            )
            assert submitted.status_code == 202, submitted.text
            answer = await gateway.get("/v1/console/snapshot", headers={"Authorization": f"Bearer {ADMIN}"})
            assert answer.status_code == 200, answer.text
            snapshot = answer.json()
    finally:
        delete_prefix(redis_url, settings.key_prefix)
    tenants = {tenant["name"]: tenant for tenant in snapshot["tenants"]}
    team = tenants["team-a"]
    assert (team["usage"]["queued_jobs"], team["usage"]["requests_last_minute"]) == (1, 1)
    assert (team["limits"]["max_queued_jobs"], team["limits"]["tokens_per_minute"]) == (5, 1000)
    assert team["limits"]["max_running_jobs"] is None
    queues = {queue["model"]: queue for queue in snapshot["queues"]}  # the declared models, no live worker
    assert (queues["smol"]["workers"], queues["smol"]["queued"]) == (0, 1)
    assert snapshot["workers"] == [] and len(snapshot["history"]) == 1
