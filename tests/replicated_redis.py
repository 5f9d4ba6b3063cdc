"""A master, its replica and (when asked for) three Sentinels, each a `redis-server` process of
the test's own on a free loopback port, as a Sentinel-managed Redis runs in production."""

from __future__ import annotations

import signal
import time
from dataclasses import dataclass, field
from pathlib import Path

import redis

from tests.helpers import eventually_sync
from tests.processes import Processes, free_port

MASTER_NAME = "streampool"
FAILOVER_TIMEOUT = 60
PARTITION_PASSWORD = "partitioned"  # what a master cut off from the Sentinels requires of new clients


@dataclass
class ReplicatedRedis:
    processes: Processes
    data_dir: Path
    ports: dict[str, int] = field(default_factory=dict)  # master, replica, sentinel-<n>
    sentinels: list[str] = field(default_factory=list)

    @classmethod
    def start(cls, processes: Processes, sentinels: int = 0) -> ReplicatedRedis:
        cluster = cls(processes, processes.log_dir / "redis")
        master, replica = free_port(), free_port()
        cluster.ports.update(master=master, replica=replica)
        # Redis waits 5 s for more replicas before a diskless sync by default; one is all there is.
        at_once = ("--repl-diskless-sync-delay", "0")
        processes.start_redis("master", master, cluster.data_dir / "master", *at_once)
        replica_of = ("--replicaof", "127.0.0.1", str(master))
        processes.start_redis("replica", replica, cluster.data_dir / "replica", *at_once, *replica_of)
        cluster.wait_replica_online()
        for n in range(sentinels):
            name, port = f"sentinel-{n}", free_port()
            cluster.ports[name] = port
            cluster.sentinels.append(
                processes.start_sentinel(name, port, cluster.data_dir / name, MASTER_NAME, master)
            )
        return cluster

    def url(self, name: str) -> str:
        return f"redis://127.0.0.1:{self.ports[name]}/0"

    @property
    def sentinel_url(self) -> str:
        return f"redis+sentinel://{','.join(self.sentinels)}/{MASTER_NAME}"

    def client(self, name: str) -> redis.Redis:
        return redis.Redis.from_url(self.url(name), decode_responses=True, socket_timeout=5)

    def wait_replica_online(self, master: str = "master") -> None:
        """Until the master `master` lists its replica as online (its sync done)."""

        def online() -> bool:
            with self.client(master) as server:
                replica = server.info("replication").get("slave0")
            return isinstance(replica, dict) and replica["state"] == "online"

        eventually_sync(online, f"{master}'s replica is online", FAILOVER_TIMEOUT, interval=0.1)

    def kill(self, name: str) -> None:
        """SIGKILL: the server dies with whatever it had not sent its replica."""
        self.processes.signal(name, signal.SIGKILL)
        self.processes.children[name].wait(30)

    def kill_after_writing_alone(self, name: str, seconds: float) -> None:
        """SIGKILL the master `name` after `seconds` of writes its replica never receives: the replica
        is given a wrong master password, so that it cannot connect again, and its link is cut (CLIENT
        KILL TYPE replica). Once the master is dead the replica's password is put right, for when it
        is a replica again."""
        replica_name = self.other_than(name)
        with self.client(replica_name) as replica, self.client(name) as master:
            replica.config_set("masterauth", "not-the-masters")
            master.execute_command("CLIENT", "KILL", "TYPE", "replica")
            time.sleep(seconds)
            assert replica.info("replication")["master_link_status"] == "down"
            self.kill(name)
            replica.config_set("masterauth", "")

    def cut_off_from_sentinels(self, name: str) -> None:
        """A partition: the Sentinels lose the master `name` (it requires a password of new clients, and
        their connections are cut), so they promote its replica, while the clients already connected to
        it (a gateway's, a worker's) go on with it, as the clients on its side of a partition do."""
        with self.client(name) as server:
            server.config_set("requirepass", PARTITION_PASSWORD)
            for client in server.client_list():
                if client["name"].startswith("sentinel-"):
                    server.client_kill_filter(_id=client["id"])

    def rejoin(self, name: str) -> None:
        """The partition `cut_off_from_sentinels` made ends: `name` becomes a replica of the master the
        Sentinels name now (as they make it once they reach it), and its sync is done."""
        url = self.url(name)
        with redis.Redis.from_url(url, password=PARTITION_PASSWORD, decode_responses=True) as server:
            server.config_set("requirepass", "")
            server.replicaof("127.0.0.1", self.master_port())
        self.wait_replica_online(self.other_than(name))

    def other_than(self, name: str) -> str:
        return "replica" if name == "master" else "master"

    def master_port(self) -> int:
        """The port of the master the Sentinels name now."""
        sentinel = redis.Redis.from_url(f"redis://{self.sentinels[0]}", decode_responses=True)
        with sentinel:
            _, port = sentinel.sentinel_get_master_addr_by_name(MASTER_NAME)
        return int(port)

    def restore_replica(self, name: str) -> None:
        """Start the dead server `name` again as a replica of the master now, and wait until the
        Sentinels know it as a replica they could promote."""
        master = self.master_port()
        replica_of = ("--replicaof", "127.0.0.1", str(master), "--repl-diskless-sync-delay", "0")
        self.processes.start_redis(name, self.ports[name], self.data_dir / name, *replica_of)

        def promotable() -> bool:
            sentinel = redis.Redis.from_url(f"redis://{self.sentinels[0]}", decode_responses=True)
            with sentinel:
                replicas = sentinel.sentinel_slaves(MASTER_NAME)
            return any(
                int(replica["port"]) == self.ports[name]
                and not replica["is_sdown"]
                and replica["master-link-status"] == "ok"
                for replica in replicas
            )

        eventually_sync(promotable, f"the Sentinels see {name} as a replica", FAILOVER_TIMEOUT, interval=0.2)

    def wait_failover_from(self, dead: str) -> None:
        """Until the Sentinels have promoted the other server (the one `dead` is not) and it answers
        as master."""
        survivor = self.other_than(dead)

        def promoted() -> bool:
            if self.master_port() != self.ports[survivor]:
                return False
            with self.client(survivor) as server:
                return bool(server.info("replication")["role"] == "master")

        eventually_sync(promoted, f"the Sentinels promote {survivor}", FAILOVER_TIMEOUT, interval=0.1)
