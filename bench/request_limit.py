"""A long-poll's physical limit: the CPU the gateway's HTTP server spends on one request, alone.

    python -m bench.request_limit [--connections N] [--requests-per-second R] [--seconds S]

A client at a stream's tip long-polls once per step of its job: each event costs it a request. Here the
gateway's server, uvicorn with the gateway's own configuration (httptools, uvloop, no access log),
serves an application that does nothing but answer every request at once with one long-poll page of
one delta; another process sends `requests_per_second` requests a second over `connections` kept-alive
connections, each waiting for its answer before it sends the next, as a long-polling client does. The
server's CPU per request is the floor under the gateway's CPU per long-polled event on the same
machine, whatever the relay does.
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import socket
import time
from dataclasses import dataclass
from typing import Any

import psutil
import uvicorn
import uvloop
from starlette.types import Receive, Scope, Send

from gateway.entries import Entry
from gateway.routes.jobs import page_json
from shared.events import DeltaEvent, JobState

CONNECTIONS = 200
REQUESTS_PER_SECOND = 1000.0
SECONDS = 5.0
SETTLE_SECONDS = 1.0  # left out of the measured window at each end: the first polls, and the last


def poll_page() -> bytes:
    """A long-poll page of one delta of one token, as the events route answers at a stream's tip."""
    data = DeltaEvent(seq=1234, text=" token", token_ids=[12345]).model_dump_json()
    entry = Entry("1234-1", "delta", data, str(time.time_ns() // 1_000_000))
    return page_json([entry], entry.id, JobState.running, False).encode()


class PageServer:
    """An ASGI application that answers every request with the same page, and nothing else."""

    def __init__(self, page: bytes) -> None:
        self.body = {"type": "http.response.body", "body": page}
        self.start = {
            "type": "http.response.start",
            "status": 200,
            "headers": [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(page))],
        }

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            await send(self.start)
            await send(self.body)


def _serve(listening: socket.socket) -> None:
    """uvicorn as `gateway.app.GatewayServer` configures it, on the socket the parent bound."""
    config = uvicorn.Config(PageServer(poll_page()), http="httptools", log_config=None, access_log=False)
    uvicorn.Server(config).run(sockets=[listening])


async def _poll(port: int, connections: int, requests_per_second: float, seconds: float, ready: Any) -> int:
    """Open every connection and set `ready`; then, for `seconds`, every connection polls at its share
    of the rate, its phase apart from the others'. The requests answered."""
    interval = connections / requests_per_second
    request = b"GET /v1/jobs/job/events?after=1234-0&wait=30 HTTP/1.1\r\nHost: bench\r\n\r\n"
    opened = [await asyncio.open_connection("127.0.0.1", port) for _ in range(connections)]
    ready.set()
    began = time.monotonic()

    async def poll(index: int, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> int:
        due, answered = began + index / connections * interval, 0
        while due < began + seconds:
            await asyncio.sleep(max(0.0, due - time.monotonic()))
            writer.write(request)
            head = await reader.readuntil(b"\r\n\r\n")
            length = next(
                int(line.split(b":")[1])
                for line in head.split(b"\r\n")
                if line.lower().startswith(b"content-length")
            )
            await reader.readexactly(length)
            answered, due = answered + 1, due + interval
        writer.close()
        return answered

    return sum(await asyncio.gather(*(poll(index, *pair) for index, pair in enumerate(opened))))


def _client(
    port: int, connections: int, requests_per_second: float, seconds: float, ready: Any, answered: Any
) -> None:
    answered.put(uvloop.run(_poll(port, connections, requests_per_second, seconds, ready)))


@dataclass(frozen=True)
class RequestCost:
    connections: int
    requests_per_second: float
    page_bytes: int
    requests: int  # in the measured window, by the rate
    cpu_us_per_request: float
    answered: int  # every request the client had answered, the window's and those around it


def measure(
    connections: int = CONNECTIONS, requests_per_second: float = REQUESTS_PER_SECOND, seconds: float = SECONDS
) -> RequestCost:
    """The server process's CPU (user and system) per request in the window after the connections
    opened, in µs."""
    context = multiprocessing.get_context("spawn")
    with socket.create_server(("127.0.0.1", 0), backlog=connections) as listening:
        port = listening.getsockname()[1]
        server = context.Process(target=_serve, args=(listening,), daemon=True)
        server.start()
        try:
            measured = psutil.Process(server.pid)
            _wait_answering(port)
            ready, answered = context.Event(), context.Queue()
            client = context.Process(
                target=_client,
                args=(port, connections, requests_per_second, seconds, ready, answered),
                daemon=True,
            )
            client.start()
            if not ready.wait(timeout=60):
                raise RuntimeError("the client did not open its connections within 60 s")
            time.sleep(SETTLE_SECONDS)
            began = measured.cpu_times()
            time.sleep(seconds - 2 * SETTLE_SECONDS)
            ended = measured.cpu_times()
            got = answered.get(timeout=seconds + 60)
            client.join()
        finally:
            server.terminate()
            server.join()
    window = seconds - 2 * SETTLE_SECONDS
    requests = round(requests_per_second * window)
    cpu = (ended.user + ended.system) - (began.user + began.system)
    return RequestCost(
        connections, requests_per_second, len(poll_page()), requests, cpu / requests * 1e6, got
    )


def _wait_answering(port: int, timeout: float = 30.0) -> None:
    """Until the server answers a request (its process imports uvicorn first)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1) as probe:
                probe.sendall(b"GET / HTTP/1.1\r\nHost: bench\r\nConnection: close\r\n\r\n")
                if probe.recv(16).startswith(b"HTTP/1.1 200"):
                    return
        except OSError:
            if time.monotonic() > deadline:
                raise
        time.sleep(0.1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--connections", type=int, default=CONNECTIONS)
    parser.add_argument("--requests-per-second", type=float, default=REQUESTS_PER_SECOND)
    parser.add_argument("--seconds", type=float, default=SECONDS)
    args = parser.parse_args()
    cost = measure(args.connections, args.requests_per_second, args.seconds)
    print(
        f"{cost.cpu_us_per_request:.1f} µs of the server's CPU a request answered with a"
        f" {cost.page_bytes}-byte page, {cost.requests_per_second:g} a second over {cost.connections}"
        f" kept-alive connections ({cost.requests:,} requests)"
    )


if __name__ == "__main__":
    main()
