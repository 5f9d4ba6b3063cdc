"""What one reader may cost a gateway: a place among a bounded number of open streams, a bounded
number of bytes of events, and no long parse on the event loop for a running job's record.

The stream limits are seen over real sockets against a real gateway process that requires API
keys, with no worker: the jobs stay queued, so their streams stay open as long as a test holds them.
"""

from __future__ import annotations

import asyncio
import threading
import uuid
from collections.abc import Callable, Iterator
from contextlib import AsyncExitStack

import httpx
import pytest
import redis.asyncio as aioredis

from gateway.relay.cursors import START
from gateway.relay.entries import Entry, entries_bytes
from gateway.relay.following import FIRST_READ
from gateway.relay.relay import Relay
from gateway.relay.subscription import Subscription
from shared import jobstore
from shared.config import DEFAULT_MODEL_DIR
from shared.events import DeltaEvent, Progress
from shared.jobstore import JobStore
from shared.requests import JobRequest
from tests.gateway.keyed_gateway import KEY_A, KEY_B, KeyedGateway, bearer, run_keyed_gateway
from tests.gateway.raw_http import raw_request
from tests.gateway.stand_ins import StandInWorker
from tests.helpers import eventually, scrape

MOST_STREAMS = 3
ANSWER_DEADLINE = 60  # for an answer's head: one comes at once, but a loaded machine may be slow
MOST_PER_KEY = 2
POLL_WAIT = 30  # outlasts the test on any machine: each waiting poll is ended by its job's next event
BATCH_BYTES = 64 * 1024
BIG_DATA = "x" * 10_000  # an entry as large as a delta of a few tokens with 20 logprobs each
MODEL = DEFAULT_MODEL_DIR.name  # the gateway's default model (tests.conftest.make_settings)
PAST_END = "99999999999999-0"  # far after any id Redis gives today


@pytest.fixture(scope="module")
def keyed(redis_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[KeyedGateway]:
    yield from run_keyed_gateway(
        redis_url,
        tmp_path_factory.mktemp("stream-limits"),
        max_open_streams=MOST_STREAMS,
        max_open_streams_per_key=MOST_PER_KEY,
    )


async def _job_of(keyed: KeyedGateway, key: str) -> tuple[str, str]:
    """A new job of `key`'s, and the cursor of its last event."""
    async with httpx.AsyncClient(base_url=keyed.base_url, headers=bearer(key)) as http:
        answer = await http.post("/v1/jobs", json={"prompt": "held open", "max_tokens": 1})
        assert answer.status_code == 202, answer.text
        job_id: str = answer.json()["id"]
        page = await http.get(f"/v1/jobs/{job_id}/events")
        return job_id, page.json()["cursor"]


async def _open(keyed: KeyedGateway, streams: AsyncExitStack, key: str) -> bytes:
    """Open an event stream of a job of `key`'s and hold it; the answer's head."""
    job_id, _ = await _job_of(keyed, key)
    headers = {**bearer(key), "Accept": "text/event-stream"}
    head = await streams.enter_async_context(
        raw_request(keyed.settings.port, f"/v1/jobs/{job_id}/events", headers)
    )
    return await asyncio.wait_for(head, ANSWER_DEADLINE)


async def _poll(keyed: KeyedGateway, streams: AsyncExitStack, key: str) -> tuple[str, asyncio.Task[bytes]]:
    """Send a long-poll at the end of a new job of `key`'s, held open: the job, and its answer's head
    (a refused poll answers at once, one let in once its job has a new event)."""
    job_id, cursor = await _job_of(keyed, key)
    target = f"/v1/jobs/{job_id}/events?after={cursor}&wait={POLL_WAIT}"
    return job_id, await streams.enter_async_context(raw_request(keyed.settings.port, target, bearer(key)))


async def _readers_are(keyed: KeyedGateway, expected: int) -> None:
    """Until the gateway holds `expected` places among its open readers, as its /metrics says."""
    async with httpx.AsyncClient(base_url=keyed.base_url) as http:

        async def held() -> float:
            return (await scrape(http)).value("streampool_readers_open")

        await eventually(
            held, f"{expected} places held among the open readers", until=lambda n: n == expected
        )


def _refused(head: bytes) -> bool:
    return head.startswith(b"HTTP/1.1 429") and b"retry-after: 1" in head.lower()


async def test_streams_past_the_limits_per_key_and_per_gateway_get_429_before_they_start(
    keyed: KeyedGateway, redis_client: aioredis.Redis
) -> None:
    await _readers_are(keyed, 0)  # an earlier test's streams have given their places back
    async with AsyncExitStack() as streams:
        for _ in range(MOST_PER_KEY):
            assert (await _open(keyed, streams, KEY_A)).startswith(b"HTTP/1.1 200")
        assert _refused(await _open(keyed, streams, KEY_A))  # the key is at its limit
        polled, poll = await _poll(keyed, streams, KEY_B)
        await _readers_are(keyed, MOST_STREAMS)  # a waiting poll counts too
        assert _refused(await _open(keyed, streams, KEY_B))  # the gateway is at its limit
        store = JobStore(redis_client, keyed.keys, keyed.settings)
        await StandInWorker(store, polled).start(await store.model_of(polled))
        assert (await asyncio.wait_for(poll, ANSWER_DEADLINE)).startswith(
            b"HTTP/1.1 200"
        )  # let in, not refused
    await _readers_are(keyed, 0)  # every place is given back as its stream ends
    async with AsyncExitStack() as streams:
        for n in range(MOST_STREAMS):
            assert (await _open(keyed, streams, KEY_B if n else KEY_A)).startswith(b"HTTP/1.1 200")


async def test_a_catch_up_reads_batches_of_bounded_bytes_not_of_entries(relay: Relay) -> None:
    job_id = uuid.uuid4().hex
    stream = relay.keys.stream(job_id)
    pipe = relay.redis.pipeline(transaction=False)
    for _ in range(200):  # 2 MB: before, one read of 512 entries took it all at once
        pipe.xadd(stream, {"type": "delta", "data": BIG_DATA})
    pipe.xadd(stream, {"type": "done", "data": "{}"})
    await pipe.execute()
    following = relay.follow(job_id, START, batch_bytes=BATCH_BYTES)
    batches = [batch async for batch in following.batches(1.0)]
    assert sum(map(len, batches)) == 201
    assert len(batches[0]) <= FIRST_READ
    assert all(entries_bytes(batch) <= BATCH_BYTES for batch in batches[1:])


def test_a_follower_behind_the_hub_by_more_than_its_bytes_catches_up_by_itself() -> None:
    subscription = Subscription("a-stream", START, max_bytes=BATCH_BYTES)
    batch = [Entry(f"{n}-0", "delta", BIG_DATA) for n in range(4)]  # 40 KB: few entries, many bytes
    offered = [subscription.offer(batch, entries_bytes(batch)) for _ in range(3)]
    subscription.close()
    # The first batch is taken as it comes (a follower that keeps up is never measured); past it,
    # the follower holds at most BATCH_BYTES more before it is dropped, far below 1,024 entries.
    assert offered == [True, True, False] and subscription.lagged


async def test_a_long_running_jobs_output_is_assembled_off_the_event_loop(
    store_factory: Callable[..., JobStore], monkeypatch: pytest.MonkeyPatch
) -> None:
    store = store_factory()
    job_id = (await store.submit(JobRequest(prompt="long", max_tokens=4), model="model", max_queued=0)).job_id
    assert await store.start(job_id, "stand-in-worker", "model", lease_seconds=60) is not None
    pipe = store.redis.pipeline(transaction=False)
    for seq in range(2, 2 + jobstore.LONG_STREAM + 1):
        pipe.xadd(store.keys.stream(job_id), {"type": "delta", "data": _delta(seq)})
    await pipe.execute()
    threads: list[str] = []

    class Spied(Progress):
        @classmethod
        def of(cls, events):  # type: ignore[no-untyped-def]
            threads.append(threading.current_thread().name)
            return Progress.of(events)

    monkeypatch.setattr(jobstore, "Progress", Spied)
    record = await store.record(job_id)
    assert record.output.token_count == jobstore.LONG_STREAM + 1
    assert threads and threads[0] != threading.main_thread().name


def _delta(seq: int) -> str:
    return DeltaEvent(seq=seq, text="a", token_ids=[seq]).model_dump_json()


async def _response_of(keyed: KeyedGateway, key: str) -> str:
    """A new background response of `key`'s (queued: no worker runs it); its job id."""
    async with httpx.AsyncClient(base_url=keyed.base_url, headers=bearer(key)) as http:
        body = {"model": MODEL, "input": "held open", "background": True, "max_output_tokens": 1}
        answer = await http.post("/v1/responses", json=body)
        assert answer.status_code == 200, answer.text
        response_id: str = answer.json()["id"]
        return response_id.removeprefix("resp_")


async def _open_response_stream(keyed: KeyedGateway, streams: AsyncExitStack, key: str) -> bytes:
    job_id = await _response_of(keyed, key)
    target = f"/v1/responses/resp_{job_id}?stream=true"
    head = await streams.enter_async_context(raw_request(keyed.settings.port, target, bearer(key)))
    return await asyncio.wait_for(head, ANSWER_DEADLINE)


async def test_responses_openai_and_tgi_streams_count_against_the_reader_limits(keyed: KeyedGateway) -> None:
    await _readers_are(keyed, 0)  # an earlier test's streams have given their places back
    async with AsyncExitStack() as streams:
        for _ in range(MOST_PER_KEY):
            assert (await _open_response_stream(keyed, streams, KEY_A)).startswith(b"HTTP/1.1 200")
        assert _refused(await _open_response_stream(keyed, streams, KEY_A))
        assert _refused(await _open(keyed, streams, KEY_A))  # the same places as the job API's
        async with httpx.AsyncClient(
            base_url=keyed.base_url, headers=bearer(KEY_A), timeout=ANSWER_DEADLINE
        ) as http:
            chat = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "stream": True}
            for path, body in (("/v1/chat/completions", chat), ("/generate_stream", {"inputs": "hi"})):
                assert (await http.post(path, json=body)).status_code == 429, path


async def test_a_cursor_waiting_for_its_stream_and_a_responses_cancel_waiting_for_its_end_hold_places(
    keyed: KeyedGateway, redis_client: aioredis.Redis
) -> None:
    await _readers_are(keyed, 0)  # an earlier test's streams have given their places back
    store = JobStore(redis_client, keyed.keys, keyed.settings)
    waiting = StandInWorker(store, (await _job_of(keyed, KEY_A))[0])
    await waiting.start(await store.model_of(waiting.job_id))
    cancelled = StandInWorker(store, await _response_of(keyed, KEY_A))
    await cancelled.start(await store.model_of(cancelled.job_id))
    async with AsyncExitStack() as streams, httpx.AsyncClient(base_url=keyed.base_url) as http:
        target = f"/v1/jobs/{waiting.job_id}/events?after={PAST_END}&wait={POLL_WAIT}"
        ahead = await streams.enter_async_context(raw_request(keyed.settings.port, target, bearer(KEY_A)))
        cancel = asyncio.create_task(
            http.post(
                f"/v1/responses/resp_{cancelled.job_id}/cancel",
                headers=bearer(KEY_A),
                timeout=ANSWER_DEADLINE,
            )
        )
        await _readers_are(keyed, MOST_PER_KEY)  # the cursor and the cancel wait, each in a place
        # Refused while the cursor still waits: it does for AHEAD_WAIT_SECONDS (10 s), which this
        # one request, and the check above since the cursor was sent, take a small part of.
        assert _refused(await _open(keyed, streams, KEY_A))  # both places of the key are held
        await cancelled.end_cancelled()
        assert (await asyncio.wait_for(cancel, ANSWER_DEADLINE)).json()["status"] == "cancelled"
        assert (await _open(keyed, streams, KEY_A)).startswith(b"HTTP/1.1 200")  # one given back
        await waiting.run_to_done()  # the job ends short of the cursor
        assert (await asyncio.wait_for(ahead, ANSWER_DEADLINE)).startswith(b"HTTP/1.1 422")
