"""A gateway's physical limit: the CPU one event's write to a client's socket costs the writer alone.

    python -m bench.socket_limit [--connections N] [--rounds-per-second R] [--seconds S]

A gateway relays each live event with one write to its client's socket (a chunk of an SSE answer).
Here a process does only that, as a gateway does when a worker steps: `rounds_per_second` times a
second it writes an event's chunk to each of `connections` loopback TCP sockets in turn, their peers
read by another process that sleeps between rounds. Its CPU per write is the floor under the
gateway's CPU per event on the same machine. On loopback the kernel delivers to the reading socket,
and wakes its reader, in the writer's system call, so a write here costs the writer more than one
to a remote client would.
"""

from __future__ import annotations

import argparse
import multiprocessing
import selectors
import socket
import time
from typing import Any

from bench.limit_figures import WriteCost
from gateway.relay.entries import Entry
from gateway.relay.sse import entry_frame
from shared.events import DeltaEvent

CONNECTIONS = 1000
ROUNDS_PER_SECOND = 10.0
SECONDS = 5.0


def event_chunk() -> bytes:
    """One delta of one token as the gateway writes it: an SSE frame in an HTTP/1.1 chunk."""
    data = DeltaEvent(seq=1234, text=" token", token_ids=[12345]).model_dump_json()
    frame = entry_frame(Entry("1234-1", "delta", data, str(time.time_ns() // 1_000_000)))
    return b"%x\r\n%b\r\n" % (len(frame), frame)


def _read_all(port: int, connections: int, ready: Any) -> None:
    """The clients: connect every socket, then read until each is closed."""
    selector = selectors.DefaultSelector()
    for _ in range(connections):
        client = socket.create_connection(("127.0.0.1", port))
        client.setblocking(False)
        selector.register(client, selectors.EVENT_READ)
    ready.set()
    open_ = connections
    while open_:
        for key, _ in selector.select():
            sock: socket.socket = key.fileobj  # type: ignore[assignment]
            if not sock.recv(1 << 16):
                selector.unregister(sock)
                sock.close()
                open_ -= 1


def measure(
    connections: int = CONNECTIONS, rounds_per_second: float = ROUNDS_PER_SECOND, seconds: float = SECONDS
) -> WriteCost:
    """The writer's CPU (user and system) per write, in µs."""
    chunk = event_chunk()
    rounds = max(1, round(rounds_per_second * seconds))
    with socket.create_server(("127.0.0.1", 0), backlog=connections) as server:
        port = server.getsockname()[1]
        context = multiprocessing.get_context("spawn")
        ready = context.Event()
        reader = context.Process(target=_read_all, args=(port, connections, ready), daemon=True)
        reader.start()
        sockets = [server.accept()[0] for _ in range(connections)]
        ready.wait()
        for sock in sockets:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # as uvicorn's transports
        sends = [sock.send for sock in sockets]
        began, cpu_began = time.monotonic(), time.process_time()
        for round_ in range(rounds):
            for send in sends:
                send(chunk)
            time.sleep(max(0.0, began + (round_ + 1) / rounds_per_second - time.monotonic()))
        cpu = time.process_time() - cpu_began
        for sock in sockets:
            sock.close()
        reader.join()
    writes = rounds * connections
    return WriteCost(connections, len(chunk), writes, cpu / writes * 1e6)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--connections", type=int, default=CONNECTIONS)
    parser.add_argument("--rounds-per-second", type=float, default=ROUNDS_PER_SECOND)
    parser.add_argument("--seconds", type=float, default=SECONDS)
    args = parser.parse_args()
    cost = measure(args.connections, args.rounds_per_second, args.seconds)
    print(
        f"{cost.cpu_us_per_write:.1f} µs of the writer's CPU a write of {cost.chunk_bytes} bytes "
        f"to one of {cost.connections} loopback sockets ({cost.writes:,} writes)"
    )


if __name__ == "__main__":
    main()
