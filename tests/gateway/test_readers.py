"""Readers that stop reading or vanish, over real sockets against a real gateway process.

The gateway runs without workers: jobs are submitted over HTTP and stay queued, and
the test appends their events itself, with XADD as the worker's publisher does (fields
`type` and `data`), because a stalled reader only shows its cost under far more data
than the engine writes in a test's time.
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest
import redis.asyncio as aioredis

from shared.events import DeltaEvent, DoneEvent, Usage
from tests.gateway.keyed_gateway import KeyedGateway
from tests.helpers import eventually, notify, read_sse, stream_reader_listening, submit

WAIT_TIMEOUT = 60
STALL_EVENTS = 40_000
STALL_TEXT = "x" * 1000  # ~1 KB a frame: 40 MB in all, far past any socket buffer
RSS_GROWTH_LIMIT = 20 * 2**20  # half of what the stalled reader is sent


@pytest.fixture
async def http(gateway_process: KeyedGateway) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=gateway_process.base_url, timeout=120) as client:
        yield client


async def _open_stream(gateway: KeyedGateway, job_id: str) -> socket.socket:
    """A raw socket that asked for the job's events and read the answer's head, nothing more."""
    sock = socket.create_connection(("127.0.0.1", gateway.settings.port))
    request = f"GET /v1/jobs/{job_id}/events HTTP/1.1\r\nHost: test\r\nAccept: text/event-stream\r\n\r\n"
    sock.sendall(request.encode())
    head = b""
    while b"\r\n\r\n" not in head:
        head += await asyncio.to_thread(sock.recv, 1)
    assert head.startswith(b"HTTP/1.1 200"), head
    return sock


def _read_to_terminal(sock: socket.socket) -> list[tuple[str, str]]:
    """(stream id, event type) of every frame up to the terminal one (chunk sizes are skipped)."""
    sock.settimeout(WAIT_TIMEOUT)
    received = b""
    while b"event: done" not in received:
        data = sock.recv(1 << 20)
        assert data, "the stream closed before its terminal event"
        received += data
    frames: list[tuple[str, str]] = []
    entry_id = ""
    for line in received.decode().split("\r\n"):
        if line.startswith("id: "):
            entry_id = line[4:]
        elif line.startswith("event: "):
            frames.append((entry_id, line[7:]))
    return frames


async def _metric(http: httpx.AsyncClient, name: str) -> float:
    text = (await http.get("/metrics")).text
    return next(float(line.split()[-1]) for line in text.splitlines() if line.startswith(f"{name} "))


def _restart_peak_memory(gateway: KeyedGateway) -> int:
    """The gateway's resident memory, from which its peak (VmHWM) counts again."""
    (Path("/proc") / str(gateway.pid) / "clear_refs").write_text("5")
    return _peak_memory(gateway)


def _peak_memory(gateway: KeyedGateway) -> int:
    """The most resident memory the gateway has held since the peak was last restarted."""
    status = (Path("/proc") / str(gateway.pid) / "status").read_text()
    return next(int(line.split()[1]) * 1024 for line in status.splitlines() if line.startswith("VmHWM:"))


async def _streams_open(http: httpx.AsyncClient) -> float:
    return await _metric(http, "streampool_sse_streams_open")


async def _streams_open_are(http: httpx.AsyncClient, expected: float) -> bool:
    return await _streams_open(http) == expected


async def _reader_idle(redis_client: aioredis.Redis, gateway: KeyedGateway) -> bool:
    return not await stream_reader_listening(redis_client, gateway.keys)


async def _append_deltas(
    redis_client: aioredis.Redis, notices: str, stream: str, first_seq: int, count: int
) -> None:
    for start in range(first_seq, first_seq + count, 1000):
        pipe = redis_client.pipeline(transaction=False)
        for seq in range(start, min(start + 1000, first_seq + count)):
            data = DeltaEvent(seq=seq, text=STALL_TEXT, token_ids=[0]).model_dump_json()
            pipe.xadd(stream, {"type": "delta", "data": data})
        pipe.publish(notices, stream)
        await pipe.execute()


async def test_a_reader_that_stops_reading_costs_bounded_memory_and_resumes_without_a_gap(
    gateway_process: KeyedGateway, http: httpx.AsyncClient, redis_client: aioredis.Redis
) -> None:
    job_id = await submit(http, prompt="stalled reader", max_tokens=1)
    stream = gateway_process.keys.stream(job_id)
    stalled = await _open_stream(gateway_process, job_id)
    await eventually(
        lambda: stream_reader_listening(redis_client, gateway_process.keys),
        "the stalled reader's stream is open",
    )
    rss_before = _restart_peak_memory(gateway_process)

    await _append_deltas(redis_client, gateway_process.keys.notices_of(job_id), stream, 1, STALL_EVENTS)
    usage = Usage(prompt_tokens=1, completion_tokens=STALL_EVENTS)
    done = DoneEvent(seq=STALL_EVENTS + 1, finish_reason="length", usage=usage)
    await redis_client.xadd(stream, {"type": "done", "data": done.model_dump_json()})
    await notify(redis_client, gateway_process.keys, stream)
    # Another reader of the same job is not held back by the stalled one.
    others = await read_sse(http, job_id)
    assert len(others) == STALL_EVENTS + 2 and others[-1][1]["type"] == "done"

    received = await asyncio.to_thread(_read_to_terminal, stalled)
    stalled.close()
    # The peak since the stall began, now that the gateway has sent the stalled reader everything.
    growth = _peak_memory(gateway_process) - rss_before
    assert growth < RSS_GROWTH_LIMIT, f"the gateway grew {growth / 2**20:.0f} MiB for one stalled reader"
    stored = [(entry_id, fields["type"]) for entry_id, fields in await redis_client.xrange(stream)]
    assert received == stored  # every event once, in order, though it fell far behind


async def test_readers_that_vanish_free_their_streams_at_once(
    gateway_process: KeyedGateway, http: httpx.AsyncClient, redis_client: aioredis.Redis
) -> None:
    baseline = await _streams_open(http)
    job_ids = [await submit(http, prompt=f"vanishing reader {n}", max_tokens=1) for n in range(20)]
    sockets = [await _open_stream(gateway_process, job_id) for job_id in job_ids]
    await eventually(lambda: _streams_open_are(http, baseline + len(sockets)), "every stream is open")
    # The reader is between two blocking reads now and then: wait for it to sit in one.
    await eventually(
        lambda: stream_reader_listening(redis_client, gateway_process.keys),
        "the stream reader watches the streams",
    )
    for sock in sockets[::2]:
        sock.close()  # a clean close
    for sock in sockets[1::2]:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
        sock.close()  # a reset, as a client that crashed
    # Their jobs are silent: only noticing the disconnect can end these streams.
    await eventually(lambda: _streams_open_are(http, baseline), "the streams close")
    await eventually(lambda: _reader_idle(redis_client, gateway_process), "the stream reader stops watching")
