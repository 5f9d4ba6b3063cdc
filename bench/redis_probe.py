"""What Redis itself says: command counts and times and CPU (INFO deltas), and its limits
(`redis-benchmark` on this machine, in the same run as the figures they bound)."""

from __future__ import annotations

import csv
import shutil
import subprocess
import time
from dataclasses import dataclass, field
from typing import Any, cast
from urllib.parse import urlparse

import redis
from redis.typing import EncodableT, FieldT

from bench.limit_figures import Limit
from shared.events import DeltaEvent

IDLE_SECONDS = 2.0
BENCHMARK_CLIENTS = 50


@dataclass(frozen=True)
class Snapshot:
    calls: dict[str, int]
    cpu_seconds: float
    taken: float
    usec: dict[str, int] = field(default_factory=dict)  # time in each command, as Redis counts it


def info(client: redis.Redis, section: str) -> dict[str, Any]:
    """One section of INFO (redis-py types the sync client's answer as possibly awaitable)."""
    return cast(dict[str, Any], client.info(section))


def snapshot(client: redis.Redis) -> Snapshot:
    stats = info(client, "commandstats")
    cpu = info(client, "cpu")
    calls = {name.removeprefix("cmdstat_"): int(value["calls"]) for name, value in stats.items()}
    return Snapshot(
        calls=calls,
        cpu_seconds=float(cpu["used_cpu_user"]) + float(cpu["used_cpu_sys"]),
        taken=time.monotonic(),
        usec={name.removeprefix("cmdstat_"): int(value["usec"]) for name, value in stats.items()},
    )


def _between(before: dict[str, int], after: dict[str, int]) -> dict[str, int]:
    delta = {name: after.get(name, 0) - before.get(name, 0) for name in set(before) | set(after)}
    return {name: count for name, count in sorted(delta.items()) if count}


def calls_between(before: Snapshot, after: Snapshot) -> dict[str, int]:
    return _between(before.calls, after.calls)


def usec_between(before: Snapshot, after: Snapshot) -> dict[str, int]:
    """µs Redis spent in each command between the snapshots; a script's commands count both on their
    own and in the script's time."""
    return _between(before.usec, after.usec)


class Probe:
    """Redis CPU seconds spent on a piece of work, less what the idle server spends meanwhile."""

    def __init__(self, client: redis.Redis) -> None:
        self.client = client
        self.idle_rate = 0.0

    def measure_idle(self) -> float:
        return measure_idle([self])[0]

    def busy(self, before: Snapshot, after: Snapshot) -> float:
        return after.cpu_seconds - before.cpu_seconds - self.idle_rate * (after.taken - before.taken)


def measure_idle(probes: list[Probe]) -> list[float]:
    """Each server's CPU a second while idle, measured over the same seconds."""
    before = [snapshot(probe.client) for probe in probes]
    time.sleep(IDLE_SECONDS)
    for probe, first in zip(probes, before, strict=True):
        after = snapshot(probe.client)
        probe.idle_rate = (after.cpu_seconds - first.cpu_seconds) / (after.taken - first.taken)
    return [probe.idle_rate for probe in probes]


def stream_limits(probe: Probe, url: str, written: str, read: str, requests: int) -> list[Limit]:
    """XADD of an event as a worker writes it (MAXLEN ~ as the worker, to the stream `written`), pipelined
    by 16; and XREAD of one such entry of one stream (`read`, written here), alone and pipelined by 16.
    Both keys are deleted after."""
    delta = DeltaEvent(seq=2, text=" token", token_ids=[0]).model_dump_json()
    fields = ("type", "delta", "data", delta, "at", str(time.time_ns() // 1_000_000))
    entry: dict[FieldT, EncodableT] = dict(zip(fields[::2], fields[1::2], strict=True))
    for entry_id in ("1-1", "2-1"):
        probe.client.xadd(read, entry, id=entry_id)
    commands = (
        ("XADD", 16, ("XADD", written, "MAXLEN", "~", "100000", "*", *fields)),
        ("XREAD of one stream", 1, ("XREAD", "COUNT", "1", "STREAMS", read, "1-1")),
        ("XREAD of one stream", 16, ("XREAD", "COUNT", "1", "STREAMS", read, "1-1")),
    )
    found = []
    for name, pipeline, command in commands:
        before = snapshot(probe.client)
        per_second = benchmark(url, command, pipeline, requests)
        found.append(Limit(name, pipeline, requests, per_second, probe.busy(before, snapshot(probe.client))))
    probe.client.delete(written, read)
    return found


def benchmark(url: str, command: tuple[str, ...], pipeline: int, requests: int) -> float:
    """`redis-benchmark` sending `command` from `BENCHMARK_CLIENTS` connections, `pipeline` at a time on
    each: the requests it had answered a second."""
    program = shutil.which("redis-benchmark")
    if program is None:
        raise RuntimeError("redis-benchmark is missing (Debian: apt-get install redis-tools)")
    parsed = urlparse(url)
    arguments = [
        program,
        *("-h", parsed.hostname or "127.0.0.1", "-p", str(parsed.port or 6379)),
        *("-c", str(BENCHMARK_CLIENTS), "-n", str(requests), "-P", str(pipeline), "--csv"),
        *command,
    ]
    output = subprocess.run(arguments, check=True, capture_output=True, text=True).stdout
    header, *lines = [line for line in output.splitlines() if line]
    names = next(csv.reader([header]))
    # the first column, the test's name, is the command unquoted within: split from the right
    values = [value.strip('"') for value in lines[-1].rsplit(",", len(names) - 1)]
    row = dict(zip(names, values, strict=True))
    return float(row["rps"])
