"""A Redis Cluster of three masters, each with a replica: six `redis-server` processes of the test's own
on free loopback ports, made into one cluster by `redis-cli --cluster create`, as a clustered Redis runs
in production. Its nodes are named `node-0` to `node-5`; which of them are masters changes as masters
are killed and their replicas promoted."""

from __future__ import annotations

import shutil
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

import redis

from tests.helpers import eventually_sync
from tests.processes import Processes, free_port

MASTERS = 3
# A node unreachable this long is failing: a killed master's replica serves about 2.5 s after its death
# (about 4 s at 2000 ms).
NODE_TIMEOUT_MS = 1000
CLUSTER_TIMEOUT = 60
MIGRATE_TIMEOUT_MS = 5000


@dataclass(frozen=True)
class NodeView:
    """One line of CLUSTER NODES: a node as the node asked sees it."""

    id: str
    port: int
    flags: frozenset[str]
    master_id: str | None  # the master of a replica
    slots: tuple[tuple[int, int], ...]  # the ranges a master serves (first, last)

    @property
    def is_master(self) -> bool:
        return "master" in self.flags

    @property
    def failed(self) -> bool:
        return bool(self.flags & {"fail", "fail?", "noaddr"})

    def serves(self, slot: int) -> bool:
        return any(first <= slot <= last for first, last in self.slots)


def parse_nodes(text: str) -> list[NodeView]:
    nodes = []
    for line in text.splitlines():
        node_id, address, flags, master, *_ = line.split()[:8]
        ranges = [part for part in line.split()[8:] if not part.startswith("[")]  # `[slot->-id]`: moving
        nodes.append(
            NodeView(
                id=node_id,
                port=int(address.split("@")[0].rpartition(":")[2]),
                flags=frozenset(flags.split(",")),
                master_id=None if master == "-" else master,
                slots=tuple(_slot_range(part) for part in ranges),
            )
        )
    return nodes


def _slot_range(part: str) -> tuple[int, int]:
    first, _, last = part.partition("-")
    return int(first), int(last or first)


@dataclass(frozen=True)
class Tls:
    """A certificate for 127.0.0.1 that signs itself, so that it is its own authority: every node of a
    cluster that takes TLS alone serves it, and its clients trust it."""

    certificate: Path
    key: Path

    @classmethod
    def make(cls, folder: Path) -> Tls:
        folder.mkdir(parents=True, exist_ok=True)
        tls = cls(folder / "node.crt", folder / "node.key")
        openssl = shutil.which("openssl")
        assert openssl, "openssl is not installed (apt-get install openssl)"
        subject = ("-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1")
        command = [openssl, "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", *subject]
        subprocess.run(
            [*command, "-keyout", str(tls.key), "-out", str(tls.certificate)],
            check=True,
            capture_output=True,
            timeout=CLUSTER_TIMEOUT,
        )
        return tls

    def server_options(self) -> tuple[str, ...]:
        """A node's options to take TLS alone, from clients and from the other nodes alike."""
        files = ("--tls-cert-file", str(self.certificate), "--tls-key-file", str(self.key))
        return (
            *files,
            "--tls-ca-cert-file",
            str(self.certificate),
            "--tls-auth-clients",
            "no",
            "--tls-cluster",
            "yes",
            "--tls-replication",
            "yes",
        )


@dataclass
class ClusteredRedis:
    processes: Processes
    data_dir: Path
    tls: Tls | None = None  # given: the nodes take TLS connections alone
    ports: dict[str, int] = field(default_factory=dict)  # node-<n>
    bus_ports: dict[str, int] = field(default_factory=dict)  # node-<n>'s cluster bus
    ids: dict[str, str] = field(default_factory=dict)  # node-<n>: its cluster node id
    dead: set[str] = field(default_factory=set)

    @classmethod
    def start(cls, processes: Processes, *, replicas: int = 1, tls: Tls | None = None) -> ClusteredRedis:
        """Three masters, each with `replicas` replicas."""
        cluster = cls(processes, processes.log_dir / "redis-cluster", tls)
        for n in range(MASTERS * (1 + replicas)):
            name = f"node-{n}"
            # A bus port of its own: by default it is the port + 10000, which a free port may not allow.
            cluster.ports[name], cluster.bus_ports[name] = free_port(), free_port()
            cluster._start_node(name)
        cli = shutil.which("redis-cli")
        assert cli, "redis-cli is not installed (apt-get install redis-tools)"
        addresses = [f"127.0.0.1:{port}" for port in cluster.ports.values()]
        over = () if tls is None else ("--tls", "--cacert", str(tls.certificate))
        create = [cli, *over, "--cluster", "create", *addresses, "--cluster-replicas", str(replicas)]
        create.append("--cluster-yes")
        with open(processes.log_dir / "redis-cli-create.log", "wb") as log:
            subprocess.run(create, stdout=log, stderr=subprocess.STDOUT, check=True, timeout=CLUSTER_TIMEOUT)
        for name in cluster.ports:
            with cluster.client(name) as node:
                cluster.ids[name] = node.execute_command("CLUSTER", "MYID")
        cluster.wait_healthy()
        return cluster

    def _start_node(self, name: str) -> None:
        data_dir = self.data_dir / name
        options = (
            *("--cluster-enabled", "yes", "--cluster-config-file", str(data_dir / "nodes.conf")),
            *("--cluster-port", str(self.bus_ports[name]), "--cluster-node-timeout", str(NODE_TIMEOUT_MS)),
            *("--appendonly", "no"),
            *("--repl-diskless-sync", "yes", "--repl-diskless-sync-delay", "0"),  # a replica syncs at once
        )
        if self.tls is None:
            self.processes.start_redis(name, self.ports[name], data_dir, *options)
        else:
            self.processes.start_redis(
                name,
                0,
                data_dir,
                *options,
                "--tls-port",
                str(self.ports[name]),
                *self.tls.server_options(),
                answering=self.client(name),
            )

    @property
    def url(self) -> str:
        """Every node as a seed: whichever of them is dead, a client finds the cluster."""
        nodes = ",".join(f"127.0.0.1:{port}" for port in self.ports.values())
        if self.tls is None:
            return f"redis+cluster://{nodes}"
        return f"rediss+cluster://{nodes}?ssl_ca_certs={self.tls.certificate}"

    def client(self, name: str) -> redis.Redis:
        """A client of the node `name` alone: it follows no MOVED, which is what a node's own state needs."""
        if self.tls is None:
            return redis.Redis(port=self.ports[name], decode_responses=True, socket_timeout=5)
        return redis.Redis(
            port=self.ports[name],
            decode_responses=True,
            socket_timeout=5,
            ssl=True,
            ssl_ca_certs=str(self.tls.certificate),
        )

    def live(self) -> list[str]:
        return [name for name in self.ports if name not in self.dead]

    def nodes(self, asked: str | None = None) -> dict[str, NodeView]:
        """The cluster as the node `asked` (by default the first live one) sees it, by node name."""
        with self.client(asked or self.live()[0]) as node:
            views = parse_nodes(node.execute_command("CLUSTER", "NODES"))
        names = {port: name for name, port in self.ports.items()}
        return {names[view.port]: view for view in views}

    def masters(self) -> list[str]:
        return [name for name, view in self.nodes().items() if view.is_master and not view.failed]

    def replica_of(self, master: str) -> str:
        return next(name for name, view in self.nodes().items() if view.master_id == self.ids[master])

    def slot_of(self, key: str) -> int:
        with self.client(self.live()[0]) as node:
            return int(node.execute_command("CLUSTER", "KEYSLOT", key))

    def master_of(self, key: str) -> str:
        """The node that serves `key` now."""
        slot = self.slot_of(key)
        return next(name for name in self.masters() if self.nodes()[name].serves(slot))

    def wait_healthy(self) -> None:
        """Until every live node says `cluster_state:ok`, sees every other live node up, and all agree on
        which nodes are masters (none of them dead), and every replica has done its sync."""

        def healthy() -> bool:
            views = [self.nodes(name) for name in self.live()]
            # A node not yet in another's view (the cluster still meeting) is no healthy cluster yet.
            if any(name not in view or view[name].failed for view in views for name in self.live()):
                return False
            masters = [{name for name, v in view.items() if v.is_master and not v.failed} for view in views]
            if any(m != masters[0] for m in masters) or masters[0] & self.dead:
                return False
            for name in self.live():
                with self.client(name) as node:
                    if "cluster_state:ok" not in node.execute_command("CLUSTER", "INFO"):
                        return False
                    replication = node.info("replication")
                if replication["role"] == "slave" and not (
                    replication["master_link_status"] == "up" and not replication["master_sync_in_progress"]
                ):
                    return False
            return True

        eventually_sync(healthy, "the cluster is ok and every replica in sync", CLUSTER_TIMEOUT, interval=0.1)

    def kill(self, name: str) -> None:
        """SIGKILL: the node dies with whatever it had not sent its replica."""
        self.processes.signal(name, signal.SIGKILL)
        self.processes.children[name].wait(30)
        self.dead.add(name)

    def kill_master(self, name: str) -> str:
        """SIGKILL the master `name` and wait until its replica is promoted and the cluster is ok again;
        the promoted replica's name."""
        replica = self.replica_of(name)
        self.kill(name)
        self.wait_healthy()
        assert replica in self.masters(), f"{replica} was not promoted in {name}'s place"
        return replica

    def restart(self, name: str) -> None:
        """Start the dead node `name` again: it rejoins as the replica of the master promoted in its
        place (its nodes.conf names the cluster), and the cluster is healthy again once it has synced."""
        self._start_node(name)
        self.dead.discard(name)

        def demoted() -> bool:
            with self.client(name) as node:
                return bool(node.info("replication")["role"] == "slave")

        eventually_sync(demoted, f"{name} rejoins as a replica", CLUSTER_TIMEOUT, interval=0.05)
        self.wait_healthy()

    def move_slot(self, slot: int, to: str, *, batch: int = 10, pause: float = 0.0) -> None:
        """Move `slot` to the master `to` as `redis-cli --cluster reshard` does, its keys `batch` at a
        time with `pause` seconds between the batches, so that clients writing meanwhile meet the
        slot half-moved (ASK) and then moved (MOVED)."""
        source = next(name for name in self.masters() if self.nodes()[name].serves(slot))
        if source == to:
            return
        with self.client(source) as origin, self.client(to) as target:
            target.execute_command("CLUSTER", "SETSLOT", slot, "IMPORTING", self.ids[source])
            origin.execute_command("CLUSTER", "SETSLOT", slot, "MIGRATING", self.ids[to])
            while keys := origin.execute_command("CLUSTER", "GETKEYSINSLOT", slot, batch):
                origin.execute_command(
                    "MIGRATE", "127.0.0.1", self.ports[to], "", 0, MIGRATE_TIMEOUT_MS, "KEYS", *keys
                )
                time.sleep(pause)
            # The new owner first, so that no node sends a client back to the old one.
            for name in [to, source, *(m for m in self.masters() if m not in (to, source))]:
                with self.client(name) as node:
                    node.execute_command("CLUSTER", "SETSLOT", slot, "NODE", self.ids[to])

        def agreed() -> bool:
            return all(self.nodes(name)[to].serves(slot) for name in self.live())

        eventually_sync(agreed, f"every node knows {to} serves slot {slot}", CLUSTER_TIMEOUT, interval=0.05)
