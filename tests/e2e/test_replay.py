"""Replay: any number of readers, each from its own cursor, over SSE or long-poll."""

from __future__ import annotations

import asyncio

import httpx
import pytest
import redis.asyncio as aioredis

from tests.conftest import System
from tests.helpers import (
    LONG_PROMPT,
    TERMINAL,
    poll_all,
    read_sse,
    reconnected_mid_stream,
    streamed_text,
    submit,
    submit_and_read_sse,
    wait_for_status,
)


@pytest.fixture(scope="module")
def system(synthetic_system: System) -> System:
    """The subject is replay through the relay, not generation: its workers run the synthetic engine."""
    return synthetic_system


async def test_sse_and_long_poll_return_the_same_events(client: httpx.AsyncClient) -> None:
    job_id = await submit(client, prompt=LONG_PROMPT, max_tokens=30, stream_step=2, temperature=0)
    sse, polled = await asyncio.gather(read_sse(client, job_id), poll_all(client, job_id, limit=3))
    assert [stream_id for stream_id, _ in sse] == [event.pop("id") for event in polled]
    assert [event for _, event in sse] == polled
    assert polled[-1]["type"] in TERMINAL


async def test_reconnect_with_last_event_id_has_no_gap_and_no_duplicate(client: httpx.AsyncClient) -> None:
    job_id = await submit(client, prompt=LONG_PROMPT, max_tokens=40, temperature=0)
    await reconnected_mid_stream(client, job_id)


async def test_two_readers_of_one_job_see_identical_streams(client: httpx.AsyncClient) -> None:
    job_id = await submit(client, prompt=LONG_PROMPT, max_tokens=30, temperature=0)
    one, two = await asyncio.gather(read_sse(client, job_id), read_sse(client, job_id))
    assert one == two
    assert one[-1][1]["type"] == "done"


async def test_long_poll_cursor_walks_the_stream_to_done(client: httpx.AsyncClient) -> None:
    job_id = await submit(client, prompt="Name a fruit.", max_tokens=10)
    events = await poll_all(client, job_id, limit=2)
    record = await wait_for_status(client, job_id, {"completed"})
    assert streamed_text(events) == record["output"]["text"]
    last = await client.get(f"/v1/jobs/{job_id}/events", params={"after": events[-1]["id"]})
    assert last.json() == {"events": [], "cursor": events[-1]["id"], "status": "completed", "done": True}
    sse_past_the_end = await read_sse(client, job_id, last_event_id=events[-1]["id"])
    assert sse_past_the_end == []


async def test_cursor_older_than_what_is_kept_is_410(
    client: httpx.AsyncClient, system: System, redis_client: aioredis.Redis
) -> None:
    job_id = await submit(client, prompt="Once upon a time", max_tokens=20)
    events = await read_sse(client, job_id)
    await redis_client.xtrim(system.keys.stream(job_id), maxlen=3, approximate=False)
    expired = await client.get(f"/v1/jobs/{job_id}/events", params={"after": events[1][0]})
    assert expired.status_code == 410
    assert expired.json()["error_type"] == "cursor_expired"
    sse = await client.get(
        f"/v1/jobs/{job_id}/events", headers={"Accept": "text/event-stream", "Last-Event-ID": events[1][0]}
    )
    assert sse.status_code == 410
    kept = await client.get(f"/v1/jobs/{job_id}/events", params={"after": events[-3][0]})
    assert kept.status_code == 200 and len(kept.json()["events"]) == 2


async def test_finished_job_keys_expire_after_the_retention_period(
    client: httpx.AsyncClient, system: System, redis_client: aioredis.Redis
) -> None:
    job_id = await submit(client, prompt="Hi", max_tokens=4)
    await wait_for_status(client, job_id, {"completed"})
    retention = system.settings.retention_seconds
    for key in (system.keys.job(job_id), system.keys.stream(job_id)):
        assert 0 < await redis_client.ttl(key) <= retention


async def test_a_submit_that_asks_for_events_streams_the_job_from_its_first_event(
    client: httpx.AsyncClient,
) -> None:
    job_id, streamed = await submit_and_read_sse(client, prompt=LONG_PROMPT, max_tokens=12, temperature=0)
    assert (streamed[0][1]["type"], streamed[0][1]["seq"], streamed[0][1]["state"]) == ("status", 0, "queued")
    assert streamed[-1][1]["type"] == "done"
    assert streamed == await read_sse(client, job_id)  # the same events, ids included, as its events route


async def test_leaving_a_submit_stream_leaves_the_job_running(client: httpx.AsyncClient) -> None:
    job_id, first = await submit_and_read_sse(client, stop_after=4, prompt=LONG_PROMPT, max_tokens=30)
    rest = await read_sse(client, job_id, last_event_id=first[-1][0])
    assert rest[-1][1]["type"] == "done"
    assert [event["seq"] for _, event in first + rest] == list(range(len(first) + len(rest)))


async def test_a_submit_that_asks_for_events_is_still_refused_with_a_plain_error(
    client: httpx.AsyncClient,
) -> None:
    answer = await client.post(
        "/v1/jobs", json={"prompt": "Hi", "max_tokens": 0}, headers={"Accept": "text/event-stream"}
    )
    assert answer.status_code == 422
    assert answer.json()["error_type"] == "validation"
