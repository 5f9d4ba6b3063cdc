"""A blip of Redis under a running job (a restart, a moment out of memory) costs the job nothing:
its worker sends the steps it could not write again, the stream stays one sequence without gap or
duplicate, and the job ends on its first run (`attempts` 1).

The worker runs on a redis-server of its own, as in test_worker_redis_outage.py (whose fixture
this uses), with leases of 2 s: a blip must end well within a lease.
"""

from __future__ import annotations

import asyncio

from shared.events import JobState
from shared.requests import JobRequest
from tests.faults import test_worker_redis_outage as outages
from tests.faults.conftest import WAIT_TIMEOUT, assert_one_seamless_stream
from tests.helpers import LONG_PROMPT, eventually, streamed_token_ids

outage = outages.outage  # the fixture: one worker on a redis-server the test stops and starts
RESENT = "steps could not be written"  # worker.publisher, once when a round trip fails


async def running_job(outage: outages.Outage) -> str:
    """A long job, once it streams."""
    request = JobRequest(prompt=LONG_PROMPT, max_tokens=120, temperature=0)
    job_id = (await outage.store.submit(request, model=outage.store.settings.model_name, max_queued=0)).job_id

    async def streaming() -> bool:
        return len(streamed_token_ids(await outages.stream(outage.store, job_id))) >= 5

    await eventually(streaming, "the job streams", WAIT_TIMEOUT)
    return job_id


async def assert_completed_on_its_first_run(outage: outages.Outage, job_id: str) -> None:
    await eventually(lambda: outages.ended(outage.store, job_id), "the job ends", WAIT_TIMEOUT)
    events = await outages.stream(outage.store, job_id)
    assert_one_seamless_stream(events)
    assert events[-1]["type"] == "done"
    assert not [event for event in events if event["type"] == "status" and event["resumed"]]
    record = await outage.store.record(job_id)
    assert (record.status, record.attempts) == (JobState.completed, 1)


async def test_a_redis_restart_under_a_running_job_costs_it_no_attempt(outage: outages.Outage) -> None:
    job_id = await running_job(outage)
    await asyncio.to_thread(outage.redis.stop)
    await asyncio.to_thread(outage.redis.start)
    await assert_completed_on_its_first_run(outage, job_id)


async def test_a_full_redis_under_a_running_job_costs_it_no_attempt(outage: outages.Outage) -> None:
    job_id = await running_job(outage)
    redis = outage.store.redis
    await redis.config_set("maxmemory-policy", "noeviction")
    await redis.config_set("maxmemory", 1)  # every write is refused: OOM command not allowed
    await eventually(lambda: asyncio.sleep(0, RESENT in outage.log()), "a step is refused", WAIT_TIMEOUT)
    await redis.config_set("maxmemory", 0)
    await assert_completed_on_its_first_run(outage, job_id)
