"""A long-poll's physical limit: the CPU the gateway's HTTP server spends on one request, alone.

    python -m bench.request_limit [--connections N] [--requests-per-second R] [--seconds S]

A client at a stream's tip long-polls once per step of its job: each event costs it a request. Here the
gateway's server, uvicorn with the gateway's own configuration (httptools, uvloop, no access log),
serves an application that does nothing but answer every request at once with one long-poll page of
one delta; another process sends `requests_per_second` requests a second over `connections` kept-alive
connections, each waiting for its answer before it sends the next, as a long-polling client does. The
server's CPU per request is the floor under the gateway's CPU per long-polled event on the same
machine, whatever the relay does.

The measured window is counted in requests, not seconds: the server reads its own CPU clock (to the
nanosecond, where the kernel's per-process times come in 10 ms ticks) as it answers the first request
after a settling second's worth, and again a window's worth later. However late a loaded machine runs
the client, the window holds exactly the requests it says, and the client sends exactly
`requests_per_second` x `seconds`.
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import socket
import time
from collections.abc import Callable
from typing import Any

import uvicorn
import uvloop
from starlette.types import Receive, Scope, Send

from bench.limit_figures import RequestCost
from gateway.relay.entries import Entry
from gateway.relay.polls import page_json
from shared.events import DeltaEvent, JobState

CONNECTIONS = 200
REQUESTS_PER_SECOND = 1000.0
SECONDS = 5.0
SETTLE_SECONDS = 1.0  # left out of the measured window at each end (in requests at the rate): the first
# polls, and the last
PATH = "/v1/jobs/job/events"


def poll_page() -> bytes:
    """A long-poll page of one delta of one token, as the events route answers at a stream's tip."""
    data = DeltaEvent(seq=1234, text=" token", token_ids=[12345]).model_dump_json()
    entry = Entry("1234-1", "delta", data, str(time.time_ns() // 1_000_000))
    return page_json([entry], entry.id, JobState.running, False).encode()


class PageServer:
    """An ASGI application that answers every request with the same page, and nothing else; at the
    `marks`-th long-poll requests it answers (counted from one), it calls `mark` with its process's CPU
    time in ns."""

    def __init__(self, page: bytes, marks: tuple[int, ...], mark: Callable[[int], None]) -> None:
        self.body = {"type": "http.response.body", "body": page}
        self.start = {
            "type": "http.response.start",
            "status": 200,
            "headers": [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(page))],
        }
        self.marks, self.mark, self.polls = frozenset(marks), mark, 0

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            if scope["path"] == PATH:
                self.polls += 1
                if self.polls in self.marks:
                    self.mark(time.process_time_ns())
            await send(self.start)
            await send(self.body)


def _serve(listening: socket.socket, marks: tuple[int, int], cpu: Any) -> None:
    """uvicorn as `gateway.app.GatewayServer` configures it, on the socket the parent bound; the CPU
    times at the `marks`-th long-polls go to the `cpu` queue."""
    app = PageServer(poll_page(), marks, cpu.put)
    config = uvicorn.Config(app, http="httptools", log_config=None, access_log=False)
    uvicorn.Server(config).run(sockets=[listening])


async def _poll(port: int, connections: int, requests_per_second: float, total: int) -> tuple[int, int]:
    """Open every connection; then send `total` requests, the n-th due n / `requests_per_second` s
    after the connections opened, over the connection n modulo `connections` (each connection polls at
    its share of the rate, its phase apart from the others'). The requests sent, and those answered."""
    request = b"GET %s?after=1234-0&wait=30 HTTP/1.1\r\nHost: bench\r\n\r\n" % PATH.encode()
    opened = [await asyncio.open_connection("127.0.0.1", port) for _ in range(connections)]
    began = time.monotonic()

    async def poll(index: int, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> tuple[int, int]:
        sent = answered = 0
        for n in range(index, total, connections):
            await asyncio.sleep(max(0.0, began + n / requests_per_second - time.monotonic()))
            writer.write(request)
            sent += 1
            head = await reader.readuntil(b"\r\n\r\n")
            length = next(
                int(line.split(b":")[1])
                for line in head.split(b"\r\n")
                if line.lower().startswith(b"content-length")
            )
            await reader.readexactly(length)
            answered += 1
        writer.close()
        return sent, answered

    counts = await asyncio.gather(*(poll(index, *pair) for index, pair in enumerate(opened)))
    return sum(sent for sent, _ in counts), sum(answered for _, answered in counts)


def _client(port: int, connections: int, requests_per_second: float, total: int, counts: Any) -> None:
    counts.put(uvloop.run(_poll(port, connections, requests_per_second, total)))


def measure(
    connections: int = CONNECTIONS, requests_per_second: float = REQUESTS_PER_SECOND, seconds: float = SECONDS
) -> RequestCost:
    """The server process's CPU (user and system) per request in the window of requests after the
    first settling second's, in µs."""
    settle = round(requests_per_second * SETTLE_SECONDS)
    total = round(requests_per_second * seconds)
    window = total - 2 * settle
    if settle < 1 or window < 1:
        raise ValueError(f"{seconds} s at {requests_per_second:g} a second leave no window past the settling")
    context = multiprocessing.get_context("spawn")
    with socket.create_server(("127.0.0.1", 0), backlog=connections) as listening:
        port = listening.getsockname()[1]
        cpu, counts = context.Queue(), context.Queue()
        marks = (settle + 1, settle + window + 1)
        server = context.Process(target=_serve, args=(listening, marks, cpu), daemon=True)
        server.start()
        try:
            _wait_answering(port)
            client = context.Process(
                target=_client, args=(port, connections, requests_per_second, total, counts), daemon=True
            )
            client.start()
            sent, answered = counts.get(timeout=seconds + 60)
            client.join()
            began, ended = cpu.get(timeout=10), cpu.get(timeout=10)
        finally:
            server.terminate()
            server.join()
    cpu_us = (ended - began) / 1000
    return RequestCost(
        connections, requests_per_second, len(poll_page()), window, cpu_us / window, answered, sent
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
