"""A private Redis Cluster of M masters and no replicas for the job streams of a bench run: replicas are
availability, not capacity (a replica serves no command of the streams' clients, and its master's CPU
for feeding it is the same whatever the masters).

`redis-cli --cluster create` makes no cluster of fewer than 3 masters: the cluster is made here by
hand as that command makes it (the slots assigned, distinct config epochs, every node met), each master
given the slots of an even share of the partitions, as the command's even split of the slots gives
them (`Keys.partition_tag`).
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import redis
from redis.crc import REDIS_CLUSTER_HASH_SLOTS, key_slot

from bench import system
from shared.keys import Keys

START_TIMEOUT_SECONDS = 30.0


def slot_ranges(masters: int, partition_slots: list[int]) -> list[tuple[int, int]]:
    """Each master's range of slots (first, last), covering every slot, so that the masters hold the
    partitions' slots `partition_slots` as evenly as they divide: the ranges part between partitions."""
    ordered = sorted(set(partition_slots))
    if masters > len(ordered):
        raise ValueError(f"{masters} masters for {len(ordered)} partitions: some would hold none")
    starts = [0, *(ordered[round(n * len(ordered) / masters)] for n in range(1, masters))]
    ends = [start - 1 for start in starts[1:]] + [REDIS_CLUSTER_HASH_SLOTS - 1]
    return list(zip(starts, ends, strict=True))


def partition_slots(keys: Keys) -> list[int]:
    """The slot of each partition (its keys' and its shard channel's hash tag)."""
    return [key_slot(keys.partition_notices(partition).encode()) for partition in range(keys.partitions)]


@dataclass
class Cluster:
    """M `redis-server` processes, one master each, on free loopback ports, their files in `data_dir`."""

    data_dir: Path
    ports: list[int] = field(default_factory=list)
    bus_ports: list[int] = field(default_factory=list)
    servers: list[subprocess.Popen[bytes]] = field(default_factory=list)

    @classmethod
    def start(cls, masters: int, partition_slots: list[int], data_dir: Path) -> Cluster:
        """The cluster, once every master serves its slots and knows every other; stopped if it fails."""
        cluster = cls(data_dir)
        try:
            for n in range(masters):
                cluster._start_node(n)
            cluster._join(slot_ranges(masters, partition_slots))
        except BaseException:
            cluster.stop()
            raise
        return cluster

    def _start_node(self, n: int) -> None:
        port, bus_port = system.free_port(), system.free_port()  # the bus's own: port + 10000 may be taken
        node_dir = self.data_dir / f"master-{n}"
        node_dir.mkdir(parents=True, exist_ok=True)
        options = [
            *("--port", str(port), "--bind", "127.0.0.1", "--dir", str(node_dir)),
            *("--save", "", "--appendonly", "no"),
            *("--cluster-enabled", "yes", "--cluster-config-file", str(node_dir / "nodes.conf")),
            *("--cluster-port", str(bus_port)),
        ]
        log = open(node_dir / "redis.log", "wb")  # noqa: SIM115 - lives as long as the server
        self.servers.append(
            subprocess.Popen(["redis-server", *options], stdout=log, stderr=subprocess.STDOUT)
        )
        self.ports.append(port)
        self.bus_ports.append(bus_port)
        self._until(lambda node: bool(node.ping()), n, f"master-{n} answers")
        with self.client(n) as node:
            node.execute_command("CLUSTER", "SET-CONFIG-EPOCH", n + 1)

    def _join(self, ranges: list[tuple[int, int]]) -> None:
        for n, (first, last) in enumerate(ranges):
            with self.client(n) as node:
                node.execute_command("CLUSTER", "ADDSLOTSRANGE", first, last)
                if n:
                    node.execute_command("CLUSTER", "MEET", "127.0.0.1", self.ports[0], self.bus_ports[0])
        for n in range(len(self.ports)):
            self._until(self._joined, n, f"master-{n} sees the cluster ok")

    def _joined(self, node: redis.Redis) -> bool:
        info = str(node.execute_command("CLUSTER", "INFO"))  # type: ignore[no-untyped-call]
        state = {name: value for name, _, value in (line.partition(":") for line in info.split())}
        masters = str(len(self.ports))
        return (
            state["cluster_state"] == "ok"
            and state["cluster_size"] == masters == state["cluster_known_nodes"]
        )

    def _until(self, check: Callable[[redis.Redis], bool], n: int, what: str) -> None:
        deadline = time.monotonic() + START_TIMEOUT_SECONDS
        while time.monotonic() < deadline:
            with self.client(n) as node:
                try:
                    if check(node):
                        return
                except redis.ConnectionError:
                    pass
            time.sleep(0.1)
        raise RuntimeError(f"the cluster did not start: not so in {START_TIMEOUT_SECONDS:g} s: {what}")

    @property
    def url(self) -> str:
        return "redis+cluster://" + ",".join(f"127.0.0.1:{port}" for port in self.ports)

    def client(self, n: int) -> redis.Redis:
        """A client of the master `n` alone (its INFO is its own)."""
        return redis.Redis(port=self.ports[n], decode_responses=True, socket_timeout=5)

    def stop(self) -> None:
        for server in self.servers:
            server.terminate()
        for server in self.servers:
            server.wait()
