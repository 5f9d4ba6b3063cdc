"""Readers with cursors at or past the end of a job stream, over real sockets against a real gateway.

The gateway runs without workers. A stand-in for the worker moves the job with the job store's
own transitions (start, the step script, finish), as the worker's publisher sends them, so that
the test decides when each event is written: after the readers under test are in place.
"""

from __future__ import annotations

import asyncio
import json
import socket
from collections.abc import AsyncIterator
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis.asyncio as aioredis

from shared.jobstore import JobStore
from shared.keys import Keys
from tests.gateway.conftest import POLL_WAIT
from tests.gateway.keyed_gateway import KeyedGateway, run_gateway
from tests.gateway.raw_http import raw_request
from tests.gateway.stand_ins import DELTAS, StandInWorker, private_redis
from tests.helpers import eventually, read_sse, submit

DEADLINE = 5.0  # every answer below comes in milliseconds; a stalled reader waits a minute
PAST_END = "99999999999999-0"  # far after any id Redis gives today
SETTLE_SECONDS = 0.5  # for a reader to be waiting in the gateway
IDLE_SECONDS = 2.0  # a reader's wait watched for the reads it costs Redis


@pytest.fixture
async def http(gateway_process: KeyedGateway) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=gateway_process.base_url, timeout=120) as client:
        yield client


@pytest.fixture
def store(gateway_process: KeyedGateway, redis_client: aioredis.Redis) -> JobStore:
    return JobStore(redis_client, Keys.of(gateway_process.settings), gateway_process.settings)


async def _a_second_reader_gets_every_event(http: httpx.AsyncClient, worker: StandInWorker) -> None:
    """While the first reader holds its request, a reader from the start gets the job's every event
    up to `done`, though they are written after both readers came."""
    received: list[tuple[str, dict[str, Any]]] = []
    second = asyncio.create_task(read_sse(http, worker.job_id, into=received))
    await eventually(lambda: _has(received, 2), "the second reader has queued and running")
    await worker.run_to_done()
    events = [event for _, event in await asyncio.wait_for(second, DEADLINE)]
    assert [event["seq"] for event in events] == list(range(3 + DELTAS))
    assert events[-1]["type"] == "done"


async def _has(received: list[Any], count: int) -> bool:
    return len(received) >= count


def _reader(port: int, job_id: str, cursor: str, transport: str) -> Any:
    target = f"/v1/jobs/{job_id}/events"
    if transport == "sse":
        return raw_request(port, target, {"Accept": "text/event-stream", "Last-Event-ID": cursor})
    return raw_request(port, f"{target}?after={cursor}&wait={POLL_WAIT}", {})


@pytest.mark.parametrize("transport", ["sse", "long-poll"])
async def test_a_cursor_past_the_end_of_a_running_job_waits_is_refused_once_the_job_ends_and_stalls_no_one(
    gateway_process: KeyedGateway, http: httpx.AsyncClient, store: JobStore, transport: str
) -> None:
    worker = StandInWorker(store, await submit(http, prompt="past the end", max_tokens=DELTAS))
    await worker.start()
    async with _reader(gateway_process.settings.port, worker.job_id, PAST_END, transport) as head:
        await asyncio.sleep(SETTLE_SECONDS)
        assert not head.done()  # waiting for the stream to reach the cursor, as after a failover
        await _a_second_reader_gets_every_event(http, worker)
        assert (await asyncio.wait_for(head, DEADLINE)).startswith(b"HTTP/1.1 422")


@pytest.mark.parametrize("transport", ["sse", "long-poll"])
async def test_a_cursor_just_past_the_end_gets_what_follows_it_once_the_stream_reaches_it(
    http: httpx.AsyncClient, store: JobStore, transport: str
) -> None:
    """What a reader that reconnects after a failover holds: the id of an event the old master
    relayed and the new one has not received yet (its worker writes it again, under that id)."""
    worker = StandInWorker(store, await submit(http, prompt="just past the end", max_tokens=DELTAS))
    await worker.start()  # the stream holds seqs 0 and 1; the reader saw up to 3

    async def seqs_read() -> list[int]:
        if transport == "sse":
            return [event["seq"] for _, event in await read_sse(http, worker.job_id, "3-1")]
        params = {"after": "3-1", "wait": str(POLL_WAIT)}
        answer = await http.get(f"/v1/jobs/{worker.job_id}/events", params=params)
        assert answer.status_code == 200, answer.text
        return [event["seq"] for event in answer.json()["events"]]

    reading = asyncio.create_task(seqs_read())
    await asyncio.sleep(SETTLE_SECONDS)
    await worker.run_to_done()
    seqs = await asyncio.wait_for(reading, DEADLINE)
    if transport == "sse":
        assert seqs == list(range(4, 3 + DELTAS))
    else:  # a poll answers with the first batch written after its cursor
        assert seqs and seqs == list(range(4, 4 + len(seqs)))


async def _finished_job(http: httpx.AsyncClient, store: JobStore, cursor: str) -> tuple[str, str]:
    """A job run to `done` by the stand-in worker, and `cursor`: PAST_END, or its terminal event's id."""
    worker = StandInWorker(store, await submit(http, prompt="at the end", max_tokens=DELTAS))
    await worker.start()
    await worker.run_to_done()
    events = await read_sse(http, worker.job_id)
    return worker.job_id, events[-1][0] if cursor == "terminal" else cursor


@pytest.mark.parametrize("cursor", ["terminal", PAST_END])
async def test_sse_at_or_past_the_terminal_event_closes_at_once(
    http: httpx.AsyncClient, store: JobStore, cursor: str
) -> None:
    job_id, last_event_id = await _finished_job(http, store, cursor)
    assert await asyncio.wait_for(read_sse(http, job_id, last_event_id), DEADLINE) == []


@pytest.mark.parametrize("cursor", ["terminal", PAST_END])
async def test_a_poll_at_or_past_the_terminal_event_is_done_at_once(
    http: httpx.AsyncClient, store: JobStore, cursor: str
) -> None:
    job_id, after = await _finished_job(http, store, cursor)
    params = {"after": after, "wait": POLL_WAIT}
    answer = await asyncio.wait_for(http.get(f"/v1/jobs/{job_id}/events", params=params), DEADLINE)
    assert answer.status_code == 200, answer.text
    assert answer.json() == {"events": [], "cursor": after, "status": "completed", "done": True}


async def test_a_cursor_past_the_end_of_a_running_job_says_why_it_is_refused(
    http: httpx.AsyncClient, store: JobStore
) -> None:
    worker = StandInWorker(store, await submit(http, prompt="refused cursor", max_tokens=DELTAS))
    await worker.start()
    asking = asyncio.create_task(http.get(f"/v1/jobs/{worker.job_id}/events", params={"after": PAST_END}))
    await worker.run_to_done()  # the job ends with its stream short of the cursor
    answer = await asyncio.wait_for(asking, DEADLINE)
    assert answer.status_code == 422, answer.text
    body = answer.json()
    assert body["error_type"] == "validation"
    assert "past the job's last event" in body["error"]


async def test_a_cursor_past_the_end_waits_without_polling_and_is_woken_by_the_entry_that_reaches_it(
    tmp_path: Path,
) -> None:
    """On a private redis-server, because INFO commandstats counts the whole server's commands."""
    with private_redis(tmp_path / "redis") as url, _gateway_on(url, tmp_path / "gateway") as gateway:
        redis = aioredis.Redis.from_url(url, decode_responses=True)
        store = JobStore(redis, gateway.keys, gateway.settings)
        async with httpx.AsyncClient(base_url=gateway.base_url, timeout=60) as http:
            worker = StandInWorker(store, await submit(http, prompt="woken", max_tokens=DELTAS))
            await worker.start(await store.model_of(worker.job_id))
            params = {"after": "3-1", "wait": str(POLL_WAIT)}  # the stream holds seqs 0 and 1
            await redis.config_resetstat()  # before the poll: its own reads are counted, however late
            reading = asyncio.create_task(http.get(f"/v1/jobs/{worker.job_id}/events", params=params))
            await asyncio.sleep(SETTLE_SECONDS + IDLE_SECONDS)
            stats = await redis.info("commandstats")
            assert not reading.done()
            # Polling read the stream's end and the job's status (the check's script, an ended job's
            # HGET) ten times a second. The poll's own checks cost 3 calls on this new Redis, however late
            # they run: the check's script as the poll arrives (an EVALSHA answered NOSCRIPT, then EVAL)
            # and once more (EVALSHA) as it settles to wait.
            reads = {
                name: fields["calls"]
                for name, fields in stats.items()
                if name.removeprefix("cmdstat_") in ("evalsha", "eval", "hget")
            }
            assert sum(reads.values()) <= 3, reads
            await worker.run_to_done()
            answer = await asyncio.wait_for(reading, DEADLINE)
        await redis.aclose()
    assert answer.status_code == 200, answer.text
    assert [event["seq"] for event in answer.json()["events"]][:1] == [4]


def _gateway_on(redis_url: str, folder: Path) -> AbstractContextManager[KeyedGateway]:
    """A gateway process like `gateway_process`, on the Redis at `redis_url`."""
    folder.mkdir()
    return contextmanager(run_gateway)(redis_url, folder, allow_unauthenticated=True, poll_wait_max=POLL_WAIT)


def _answers(
    port: int, targets: list[str], version: str
) -> tuple[list[tuple[bytes, dict[bytes, bytes], bytes]], bool]:
    """The answers to `targets`, asked one after another on one socket: each one's status line,
    headers and body; and whether the server closed the socket after the last."""
    with socket.create_connection(("127.0.0.1", port), timeout=DEADLINE) as sock:
        received, answers = b"", []
        for target in targets:
            sock.sendall(f"GET {target} {version}\r\nHost: test\r\n\r\n".encode())
            while b"\r\n\r\n" not in received:
                received += sock.recv(65536)
            head, _, received = received.partition(b"\r\n\r\n")
            status, *lines = head.split(b"\r\n")
            headers = dict(line.lower().split(b": ", 1) for line in lines)
            length = int(headers[b"content-length"])
            while len(received) < length:
                received += sock.recv(65536)
            answers.append((status, headers, received[:length]))
            received = received[length:]
        sock.settimeout(SETTLE_SECONDS)
        try:
            closed = sock.recv(1) == b""
        except TimeoutError:  # kept open
            closed = False
        return answers, closed


async def test_a_plain_poll_is_answered_whole_as_fastapi_answers_it_on_a_kept_and_a_closed_connection(
    http: httpx.AsyncClient, gateway_process: KeyedGateway
) -> None:
    """On the gateway's own server, a plain poll is answered before the application's stack
    (`gateway.plain_polls`), one written otherwise (`limit=01`) by FastAPI: both answers are the same
    but for their date, and the connection is kept (HTTP/1.1) or closed (HTTP/1.0) as uvicorn keeps it."""
    job_id = await submit(http, prompt="hi")
    port, events = gateway_process.settings.port, f"/v1/jobs/{job_id}/events"
    kept, kept_closed = await asyncio.to_thread(
        _answers, port, [f"{events}?limit=1", f"{events}?limit=01", f"{events}?limit=1"], "HTTP/1.1"
    )
    once, once_closed = await asyncio.to_thread(_answers, port, [f"{events}?limit=1"], "HTTP/1.0")
    for status, headers, _ in [*kept, *once]:
        assert status.endswith(b"200 OK")
        headers.pop(b"date")
    assert once[0][1].pop(b"connection") == b"close"
    assert [answer[1:] for answer in [*kept, *once]] == 4 * [kept[1][1:]]
    assert json.loads(kept[0][2])["events"][0]["state"] == "queued"
    assert (kept_closed, once_closed) == (False, True)
