"""The relay's check of a cursor (`cursor_check.lua`) against a job's record and stream, written here
with the ids the test chooses: where the cursor stands, and what answers 404 or 410."""

from __future__ import annotations

import uuid

import pytest
import redis.asyncio as aioredis

from gateway.relay.open_streams import StreamLimits
from gateway.relay.relay import Relay
from shared.errors import CursorExpired, JobNotFound
from shared.events import JobState

OWNER = "owner-a"
LIMITS = StreamLimits(most=10, most_per_owner=10, batch_bytes=65536)


async def job(relay: Relay, redis_client: aioredis.Redis, ids: list[str], kept: int | None = None) -> str:
    """A running job of `OWNER`'s whose stream has had entries `ids`, the last `kept` of them kept."""
    job_id = uuid.uuid4().hex
    await redis_client.hset(relay.keys.job(job_id), mapping={"status": "running", "owner": OWNER})
    stream = relay.keys.stream(job_id)
    for entry_id in ids:
        await redis_client.xadd(stream, {"type": "delta", "data": "{}"}, id=entry_id)
    if kept is not None:
        await redis_client.xtrim(stream, maxlen=kept, approximate=False)
    return job_id


@pytest.mark.parametrize(
    ("cursor", "at_end"), [("0-0", False), ("0", False), ("9-1", False), ("10-0", False), ("11-1", True)]
)
async def test_a_cursor_within_a_whole_stream_says_whether_anything_is_left(
    relay: Relay, redis_client: aioredis.Redis, cursor: str, at_end: bool
) -> None:
    job_id = await job(relay, redis_client, ["9-1", "10-1", "11-1"])
    assert (await relay.check(job_id, cursor, OWNER, LIMITS))[:2] == (JobState.running, at_end)


@pytest.mark.parametrize("cursor", ["0-0", "2-1", "9-1", "00009-1"])
async def test_a_cursor_before_the_first_entry_kept_of_a_trimmed_stream_is_410_with_the_oldest(
    relay: Relay, redis_client: aioredis.Redis, cursor: str
) -> None:
    """Ids compared as numbers, not as text: '2' is below '10', though after it in text."""
    job_id = await job(relay, redis_client, ["9-1", "10-1", "11-1", "30-1"], kept=3)
    with pytest.raises(CursorExpired) as expired:
        await relay.check(job_id, cursor, OWNER, LIMITS)
    assert expired.value.detail == {"oldest": "10-1"}


@pytest.mark.parametrize(("cursor", "at_end"), [("10-1", False), ("29-9", False), ("30-1", True)])
async def test_a_cursor_at_or_after_the_first_entry_kept_reads_on(
    relay: Relay, redis_client: aioredis.Redis, cursor: str, at_end: bool
) -> None:
    job_id = await job(relay, redis_client, ["9-1", "10-1", "11-1", "30-1"], kept=3)
    assert (await relay.check(job_id, cursor, OWNER, LIMITS))[:2] == (JobState.running, at_end)


async def test_ids_as_large_as_redis_makes_them_are_compared_exactly(
    relay: Relay, redis_client: aioredis.Redis
) -> None:
    top = 2**64 - 1
    job_id = await job(relay, redis_client, [f"{top - 1}-{top - 1}", f"{top - 1}-{top}"])
    assert (await relay.check(job_id, f"{top - 1}-{top - 1}", OWNER, LIMITS))[:2] == (JobState.running, False)
    assert (await relay.check(job_id, f"{top - 1}-{top}", OWNER, LIMITS))[:2] == (JobState.running, True)


@pytest.mark.parametrize(
    ("cursor", "count", "read"),
    [("0", 2, ["9-1", "10-1"]), ("10-0", 5, ["10-1", "11-1"]), ("10-1", 1, ["11-1"]), ("11-1", 5, [])],
)
async def test_the_check_reads_the_entries_after_the_cursor_it_is_asked_for(
    relay: Relay, redis_client: aioredis.Redis, cursor: str, count: int, read: list[str]
) -> None:
    job_id = await job(relay, redis_client, ["9-1", "10-1", "11-1"])
    _, _, entries = await relay.check(job_id, cursor, OWNER, LIMITS, count)
    assert [entry.id for entry in entries] == read
    assert {(entry.type, entry.data) for entry in entries} <= {("delta", "{}")}
    assert (await relay.check(job_id, cursor, OWNER, LIMITS))[2] == []


async def test_an_unknown_job_another_owners_and_a_record_without_a_stream_are_404(
    relay: Relay, redis_client: aioredis.Redis
) -> None:
    job_id = await job(relay, redis_client, ["1-1"])
    without_stream = await job(relay, redis_client, [])
    for checked, owner in [(uuid.uuid4().hex, OWNER), (job_id, "owner-b"), (without_stream, OWNER)]:
        with pytest.raises(JobNotFound):
            await relay.check(checked, "0-0", owner, LIMITS)
