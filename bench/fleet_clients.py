"""The fleet's clients: one per job, in processes of their own, each recording the deltas it receives.

In the mix a run has by default (`MIXED`), most follow over SSE (`sse_client.EventsConnection`, from the
stream's start); every tenth long-polls (`sse_client.Poller`, waiting at the tip); and every tenth other
drops its SSE connection once its first delta has come and resumes with `Last-Event-ID` from the last one
it got, as a browser's EventSource does. A run may instead have every client follow one way
(`--clients`), so that one kind's cost is measured alone. Each records, per job, every delta's seq and
arrival time (time.time()) in the order received, for `bench.delivery` to check against the stream.

A process stops by itself: when every job it follows has ended, or at its deadline. `Clients` starts
and gathers them from the harness's side.
"""

from __future__ import annotations

import asyncio
import json
import multiprocessing as mp
import multiprocessing.queues
import queue
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from multiprocessing.context import SpawnProcess
from multiprocessing.sharedctypes import Synchronized
from typing import Any

import psutil
import uvloop

from bench.delivery import delta_seq
from bench.sse_client import EventsConnection, Poller

SSE, LONG_POLL, RESUME = "sse", "long-poll", "resume"
KINDS = (SSE, LONG_POLL, RESUME)
MIXED = "mixed"
CLIENT_MIXES = (MIXED, *KINDS)
"""What `--clients` may be: the mix, or one kind for every client."""
CONNECTING = 128
"""Connections being opened at once, over all client processes: each catches up from its stream's start
on one of a gateway's few Redis connections (`redis_max_connections`), and a request that waits too
long for one is refused."""
POLL_WAIT_SECONDS = (
    30.0  # the gateway's `poll_wait_max` by default: a poll at the tip waits for the next step
)
POLL_LIMIT = 1000
TERMINAL = frozenset({"done", "cancelled", "error"})


def kind_of(index: int, clients: str = MIXED) -> str:
    """How the client of the `index`th job follows it: in the mix, one in ten long-polls and one in ten
    resumes; otherwise as `clients` says."""
    if clients != MIXED:
        return clients
    return LONG_POLL if index % 10 == 0 else RESUME if index % 10 == 5 else SSE


@dataclass(frozen=True)
class Follow:
    job_id: str
    kind: str
    port: int  # of the gateway it follows through


@dataclass
class Received:
    """One job's deltas as its client received them."""

    kind: str
    seqs: list[int] = field(default_factory=list)
    arrivals: list[float] = field(default_factory=list)
    ended: bool = False  # its terminal event came

    def add(self, seq: int, arrived: float) -> None:
        self.seqs.append(seq)
        self.arrivals.append(arrived)


@dataclass
class ClientReport:
    """What one client process received, by job, and how its follows failed."""

    received: dict[str, Received]
    failures: list[str]
    cpu_seconds: float


async def _sse(
    follow: Follow,
    received: Received,
    gate: asyncio.Semaphore,
    on_live: Callable[[], None],
    last_event_id: str | None = None,
) -> None:
    """Follow to the terminal event (from after `last_event_id`, resuming)."""

    def on_event(kind: str, data: str, arrived: float) -> None:
        if kind == "delta":
            received.add(delta_seq(data), arrived)
        elif kind in TERMINAL:
            received.ended = True

    async with gate:
        connection = await EventsConnection.open(follow.port, follow.job_id, on_event, last_event_id)
    on_live()
    try:
        await connection.closed
    finally:
        connection.close()


async def _resuming(
    follow: Follow, received: Received, gate: asyncio.Semaphore, on_live: Callable[[], None]
) -> None:
    """Follow until the first delta, drop the connection, and resume from the last delta received."""
    first: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    def on_event(kind: str, data: str, arrived: float) -> None:
        if kind == "delta":
            received.add(delta_seq(data), arrived)
            if not first.done():
                first.set_result(None)

    async with gate:
        connection = await EventsConnection.open(follow.port, follow.job_id, on_event)
    try:
        await asyncio.wait([first, connection.closed], return_when=asyncio.FIRST_COMPLETED)
    finally:
        connection.close()
    if not received.seqs:
        raise RuntimeError("the stream closed before its first delta")
    await _sse(follow, received, gate, on_live, f"{received.seqs[-1]}-1")


async def _long_poll(
    follow: Follow, received: Received, gate: asyncio.Semaphore, on_live: Callable[[], None]
) -> None:
    poller, cursor = Poller(follow.port), None
    try:
        async with gate:
            body, arrived = await poller.page(follow.job_id, cursor, POLL_WAIT_SECONDS, POLL_LIMIT)
        on_live()
        while True:
            page = json.loads(body)
            for event in page["events"]:
                if event["type"] == "delta":
                    received.add(event["seq"], arrived)
            cursor = page["cursor"]
            if page["done"]:
                received.ended = True
                return
            body, arrived = await poller.page(follow.job_id, cursor, POLL_WAIT_SECONDS, POLL_LIMIT)
    finally:
        poller.close()


FOLLOWERS = {SSE: _sse, LONG_POLL: _long_poll, RESUME: _resuming}


async def _settled(
    follow: Follow, received: Received, gate: asyncio.Semaphore, settle: Callable[[], None]
) -> None:
    """Follow the job, settling once: when live, or when it failed before."""
    settled = False

    def on_live() -> None:
        nonlocal settled
        if not settled:
            settled = True
            settle()

    try:
        await FOLLOWERS[follow.kind](follow, received, gate, on_live)
    finally:
        on_live()


async def _follow_all(
    follows: list[Follow], settled: Any, seconds: float, at_once: int
) -> tuple[dict[str, Received], list[str]]:
    gate = asyncio.Semaphore(at_once)
    received = {follow.job_id: Received(follow.kind) for follow in follows}

    def settle() -> None:
        with settled.get_lock():
            settled.value += 1

    tasks = [asyncio.ensure_future(_settled(f, received[f.job_id], gate, settle)) for f in follows]
    _, pending = await asyncio.wait(tasks, timeout=seconds)
    for task in pending:
        task.cancel()
    failures = []
    for follow, task in zip(follows, tasks, strict=True):
        if task in pending:
            failures.append(f"{follow.job_id} ({follow.kind}): still open at the deadline")
        elif task.exception() is not None:
            failures.append(f"{follow.job_id} ({follow.kind}): {task.exception()!r}")
        elif not received[follow.job_id].ended:
            failures.append(f"{follow.job_id} ({follow.kind}): closed without its terminal event")
    return received, failures


def client_process(follows: list[Follow], settled: Any, results: Any, seconds: float, at_once: int) -> None:
    """One client process: follow its jobs for at most `seconds`, opening `at_once` connections at a
    time, then put a `ClientReport` on `results`. `settled` (a shared counter) counts the follows that
    are live (answered, resumed, or polled once) or failed before."""
    began = time.process_time()
    received, failures = uvloop.run(_follow_all(follows, settled, seconds, at_once))
    results.put(ClientReport(received, failures, time.process_time() - began))


class Clients:
    """A level's client processes, one share of the jobs each, from the harness's side."""

    def __init__(
        self, job_ids: list[str], ports: list[int], processes: int, seconds: float, clients: str = MIXED
    ) -> None:
        """Start them: the `n`th job's client follows it as `kind_of(n, clients)` says, through the
        gateway of `ports` whose turn it is; each process stops by itself after `seconds` at most."""
        context = mp.get_context("spawn")
        self.count = len(job_ids)
        self.settled: Synchronized[int] = context.Value("i", 0)
        self.results: mp.queues.Queue[ClientReport] = context.Queue()
        follows = [
            Follow(job_id, kind_of(n, clients), ports[n % len(ports)]) for n, job_id in enumerate(job_ids)
        ]
        shares = [follows[n::processes] for n in range(processes)]
        at_once = max(1, CONNECTING // processes)
        self.processes: list[SpawnProcess] = [
            context.Process(target=client_process, args=(share, self.settled, self.results, seconds, at_once))
            for share in shares
            if share
        ]
        for process in self.processes:
            process.start()
        self.handles = [psutil.Process(process.pid) for process in self.processes]

    async def until_settled(self, timeout: float) -> None:
        """Until every follow is live or has failed (its report tells which), or fail once `timeout` s
        passed or a process died."""
        deadline = time.monotonic() + timeout
        while self.settled.value < self.count:
            if time.monotonic() > deadline or any(not process.is_alive() for process in self.processes):
                raise RuntimeError(f"only {self.settled.value} of {self.count} clients were live")
            await asyncio.sleep(0.1)

    async def reports(self, timeout: float) -> list[ClientReport]:
        """Every process's report, each within `timeout` s."""
        try:
            return [await asyncio.to_thread(self.results.get, True, timeout) for _ in self.processes]
        except queue.Empty:
            raise RuntimeError(f"a client process gave no report within {timeout:g} s") from None

    def stop(self) -> None:
        for process in self.processes:
            process.join(timeout=10)
            if process.is_alive():
                process.terminate()
