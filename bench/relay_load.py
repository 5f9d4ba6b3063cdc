"""Relay capacity with the engine taken out: many SSE clients on one gateway process, fed by the
synthetic producer. Clients run in separate processes (raw asyncio sockets, cheaper than httpx),
so that the load generator is not what gets measured.

`python -m bench.relay_load [--streams 100 1000 2000]` runs this phase alone (a private Redis and
one gateway, no worker, no engine) and prints one line per level; `bench.run` runs it last.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import multiprocessing as mp
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from multiprocessing.sharedctypes import Synchronized
from pathlib import Path
from typing import Any

import psutil
import redis
import redis.asyncio as aioredis

from bench import redis_probe, system
from bench.sse_client import EventsConnection
from bench.stats import percentile
from bench.synthetic_producer import TICK_SECONDS, SyntheticProducer
from bench.system import Child
from shared.config import Settings
from shared.jobstore import JobStore
from shared.keys import Keys

CONNECT_AT_ONCE = 64
CONNECT_TIMEOUT_SECONDS = 120
DRAIN_TIMEOUT_SECONDS = 60
LAG_TARGET_SECONDS = 0.020
DELIVERED_TARGET = 0.99
RATE = 10.0  # events a second per stream, as the design's target
CLIENT_PROCESSES = 2


async def _one_stream(
    port: int, job_id: str, gate: asyncio.Semaphore, connected: Any, lags: list[float]
) -> int:
    """Follow one job; the number of deltas received."""
    received = 0

    def on_event(kind: str, data: str, arrived: float) -> None:
        nonlocal received
        if kind == "delta":
            lags.append(arrived - float(json.loads(data)["text"]))
            received += 1

    async with gate:
        connection = await EventsConnection.open(port, job_id, on_event)
    with connected.get_lock():
        connected.value += 1
    try:
        await connection.closed
    finally:
        connection.close()
    return received


def client_process(port: int, job_ids: list[str], connected: Any, results: Any) -> None:
    """One client process: follow its share of the jobs, then report lags and counts."""

    async def main() -> tuple[list[float], int, int]:
        gate = asyncio.Semaphore(CONNECT_AT_ONCE)
        lags: list[float] = []
        outcomes = await asyncio.gather(
            *(_one_stream(port, job_id, gate, connected, lags) for job_id in job_ids),
            return_exceptions=True,
        )
        failures = sum(isinstance(item, BaseException) for item in outcomes)
        received = sum(item for item in outcomes if isinstance(item, int))
        return lags, received, failures

    try:
        import uvloop

        uvloop.install()
    except ImportError:
        pass
    began = time.process_time()
    lags, received, failures = asyncio.run(main())
    cpu = time.process_time() - began
    results.put({"lags": lags, "received": received, "failures": failures, "cpu": cpu})


@dataclass
class RelayLevel:
    """One load level: `streams` SSE clients at `rate` events a second each."""

    streams: int
    rate: float
    seconds: float
    sent: int
    received: int
    failures: int
    lags: list[float] = field(repr=False)
    gateway_cpu_percent: float
    gateway_cpu_per_event: float  # gateway CPU seconds from production start to the last delivery, per event
    redis_cpu_percent: float
    redis_cpu_seconds: float  # Redis's own CPU time while producing (its appends and the gateway's reads)
    redis_calls: dict[str, int]  # commands Redis ran while producing, by name
    client_cpu_percent: float
    producer_cpu_percent: float
    gateway_redis_connections: int
    connected_clients_delta: int
    worst_tick_late: float

    @property
    def lag_p50(self) -> float:
        return percentile(self.lags, 50)

    @property
    def lag_p99(self) -> float:
        return percentile(self.lags, 99)

    @property
    def delivered_per_second(self) -> float:
        return self.received / self.seconds

    @property
    def sustained(self) -> bool:
        """Lag within the target, nothing lost, and the producer kept its schedule."""
        return (
            self.lag_p99 <= LAG_TARGET_SECONDS
            and self.received >= DELIVERED_TARGET * self.sent
            and self.worst_tick_late < 0.1
        )


def _redis_connections(gateway: Child, redis_port: int) -> int:
    return sum(
        1
        for conn in gateway.handle.net_connections(kind="tcp")
        if conn.raddr and conn.raddr.port == redis_port and conn.status == psutil.CONN_ESTABLISHED
    )


async def run_level(
    producer: SyntheticProducer,
    gateway: Child,
    sync_redis: redis.Redis,
    gateway_port: int,
    redis_port: int,
    streams: int,
    rate: float,
    seconds: float,
    client_processes: int,
    on_progress: Callable[[str], None],
    tick_seconds: float = TICK_SECONDS,
) -> RelayLevel:
    """Create the jobs, connect every client, produce for `seconds`, end the jobs, gather the clients."""
    idle = redis_probe.snapshot(sync_redis)
    job_ids = await producer.create(streams)
    context = mp.get_context("spawn")
    connected: Synchronized[int] = context.Value("i", 0)
    results = context.Queue()
    shares = [job_ids[n::client_processes] for n in range(client_processes)]
    clients = [
        context.Process(target=client_process, args=(gateway_port, share, connected, results))
        for share in shares
        if share
    ]
    for process in clients:
        process.start()
    deadline = time.monotonic() + CONNECT_TIMEOUT_SECONDS
    while connected.value < streams and time.monotonic() < deadline:
        on_progress(f"{connected.value}/{streams} connected")
        await asyncio.sleep(0.2)
    if connected.value < streams:
        raise RuntimeError(f"only {connected.value} of {streams} SSE clients connected")
    on_progress(f"producing {streams} x {rate:g}/s for {seconds:g} s")
    handles = [psutil.Process(process.pid) for process in clients]
    me = psutil.Process()
    before = redis_probe.snapshot(sync_redis)
    gateway_before = gateway.cpu_seconds()
    clients_before = sum(sum(h.cpu_times()[:2]) for h in handles)
    me_before = sum(me.cpu_times()[:2])
    production = await producer.produce(job_ids, rate, seconds, tick_seconds)
    after = redis_probe.snapshot(sync_redis)
    elapsed = after.taken - before.taken
    gateway_cpu = 100 * (gateway.cpu_seconds() - gateway_before) / elapsed
    client_cpu = 100 * (sum(sum(h.cpu_times()[:2]) for h in handles) - clients_before) / elapsed
    producer_cpu = 100 * (sum(me.cpu_times()[:2]) - me_before) / elapsed
    connections = _redis_connections(gateway, redis_port)
    on_progress("ending the jobs, draining the clients")
    await producer.finish(job_ids)
    gathered = [await asyncio.to_thread(results.get, True, DRAIN_TIMEOUT_SECONDS) for _ in clients]
    received = sum(item["received"] for item in gathered)
    gateway_cpu_per_event = (gateway.cpu_seconds() - gateway_before) / max(received, 1)
    for process in clients:
        process.join(timeout=10)
    return RelayLevel(
        streams=streams,
        rate=rate,
        seconds=production.seconds,
        sent=production.events,
        received=received,
        failures=sum(item["failures"] for item in gathered),
        lags=[lag for item in gathered for lag in item["lags"]],
        gateway_cpu_percent=gateway_cpu,
        gateway_cpu_per_event=gateway_cpu_per_event,
        redis_cpu_percent=redis_probe.cpu_percent(before, after),
        redis_cpu_seconds=after.cpu_seconds - before.cpu_seconds,
        redis_calls=redis_probe.calls_between(before, after),
        client_cpu_percent=client_cpu,
        producer_cpu_percent=producer_cpu,
        gateway_redis_connections=connections,
        connected_clients_delta=after.connected_clients - idle.connected_clients,
        worst_tick_late=production.worst_tick_late,
    )


async def run_levels(
    settings: Settings,
    gateway: Child,
    streams_per_level: list[int],
    seconds: float,
    on_level: Callable[[RelayLevel], None],
    on_progress: Callable[[int, str], None],
) -> list[RelayLevel]:
    """Every level, one after the other, against the running `gateway` and the Redis of `settings`."""
    redis_client = aioredis.Redis.from_url(settings.redis_url, decode_responses=True)
    producer = SyntheticProducer(redis_client, JobStore(redis_client, Keys(settings.key_prefix), settings))
    sync_redis = redis.Redis.from_url(settings.redis_url, decode_responses=True)
    redis_port = sync_redis.connection_pool.connection_kwargs["port"]
    levels: list[RelayLevel] = []
    for streams in streams_per_level:
        level = await run_level(
            producer,
            gateway,
            sync_redis,
            settings.port,
            redis_port,
            streams,
            RATE,
            seconds,
            CLIENT_PROCESSES,
            functools.partial(on_progress, streams),
        )
        levels.append(level)
        on_level(level)
    await redis_client.aclose()
    return levels


def describe(level: RelayLevel) -> str:
    return (
        f"{level.streams} streams x {level.rate:g}/s: lag p50 {1000 * level.lag_p50:.1f} ms, "
        f"p99 {1000 * level.lag_p99:.1f} ms, max {1000 * max(level.lags, default=float('nan')):.1f} ms; "
        f"{level.received}/{level.sent} delivered ({level.delivered_per_second:.0f}/s, "
        f"{level.failures} failed streams); CPU % gateway {level.gateway_cpu_percent:.0f} "
        f"({1e6 * level.gateway_cpu_per_event:.0f} us per event), "
        f"Redis {level.redis_cpu_percent:.0f}, clients {level.client_cpu_percent:.0f}, "
        f"producer {level.producer_cpu_percent:.0f}; sustained: {'yes' if level.sustained else 'no'}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--streams", type=int, nargs="+", default=[100, 1000], help="SSE clients per level")
    parser.add_argument("--seconds", type=float, default=10.0, help="production time per level")
    parser.add_argument("--redis-url", help="use this Redis instead of a private redis-server")
    args = parser.parse_args()
    logs = Path(tempfile.mkdtemp(prefix="streampool-relay-"))
    redis_server, url = (None, args.redis_url) if args.redis_url else system.start_redis(logs)
    settings = system.bench_settings(url)
    gateway = system.start_gateway(settings, logs)
    try:
        system.wait_answering(settings, gateway)
        levels = run_levels(
            settings,
            gateway,
            args.streams,
            args.seconds,
            lambda level: print(describe(level), flush=True),
            lambda streams, text: None,
        )
        asyncio.run(levels)
    finally:
        system.tear_down([gateway], url, settings.key_prefix, redis_server)
    print(f"logs: {logs}")


if __name__ == "__main__":
    main()
