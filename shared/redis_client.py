"""Connecting to Redis, and the boundary where redis-py errors become streampool errors.

Every connection streampool makes comes from a pool made here, to a plain Redis URL or through
Sentinels (`shared.redis_url`). Either way a server that answers READONLY is no master any more (a
failover demoted it, or a managed Redis's endpoint moved): the connection is dropped, so that the
next one finds the master anew (asks the Sentinels, or resolves the endpoint's name again), and
the command fails as any command does while Redis fails over: `BackendUnavailable`.

A Redis Cluster (a `redis+cluster://` URL, or `rediss+cluster://` over TLS) is reached through
`connect_cluster`: redis-py's cluster client keeps the connections of each node apart and learns
from the nodes which master serves which slot, following their MOVED and ASK itself; a demoted
master answers MOVED, never READONLY.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

import hiredis
import redis.asyncio as aioredis
from redis._parsers.commands import AsyncCommandsParser
from redis.asyncio.cluster import ClusterNode, ClusterPipeline, RedisCluster
from redis.asyncio.connection import Connection, SSLConnection
from redis.asyncio.sentinel import Sentinel, SentinelConnectionPool, SentinelManagedConnection
from redis.cluster import get_node_name
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import (
    DataError,
    OutOfMemoryError,
    ReadOnlyError,
    RedisClusterException,
    RedisError,
)
from redis.exceptions import TimeoutError as RedisTimeoutError

from shared.errors import BackendUnavailable
from shared.redis_url import is_cluster, is_sentinel, parse_cluster_url, parse_sentinel_url

POOL_WAIT_SECONDS = 10
# A Sentinel that does not answer within this is skipped for the next one: a dead one costs a
# master lookup this long at most, a live one answers in a round trip.
SENTINEL_TIMEOUT_SECONDS = 1.0


class PackedInC:
    """Packs commands with hiredis, in C, as redis-py's own blocking connections do; its asyncio
    connections pack in Python, copying their growing buffer at every argument. A worker's step call
    carries several thousand arguments (eight a job and three an event), and packing it so cost the
    worker more than the rest of its step: 6.7 to 10 µs a job, against 1.3. The bytes are the same,
    and so are the refusals (a bool or None is no argument: DataError)."""

    def pack_command(self, *args: Any) -> list[bytes]:
        # A command name may hold its subcommand ('CONFIG GET'): Redis takes them as two arguments.
        if isinstance(args[0], str):
            args = (*args[0].encode().split(), *args[1:])
        elif b" " in args[0]:
            args = (*args[0].split(), *args[1:])
        try:
            return [hiredis.pack_command(args)]
        except TypeError as exc:
            raise DataError(str(exc)) from exc


class FailoverConnection(PackedInC, Connection):
    """A connection to a plain URL that drops itself on READONLY, so that the next one is made to
    whatever the URL names now (a managed Redis moves its endpoint to the new master on failover).
    redis-py's Sentinel connections do the same by themselves."""

    async def read_response(self, *args: Any, **kwargs: Any) -> Any:
        try:
            return await super().read_response(*args, **kwargs)
        except ReadOnlyError:
            await self.disconnect()
            raise


class SentinelConnection(PackedInC, SentinelManagedConnection):
    """A connection to the master the Sentinels name, packing its commands in C."""


class ClusterConnection(PackedInC, Connection):
    """A connection to one node of a Redis Cluster, packing its commands in C."""


class ClusterTlsConnection(PackedInC, SSLConnection):
    """A TLS connection to one node of a Redis Cluster (`rediss+cluster://`), packing its commands in C."""


UNBOUNDED_PER_NODE = 2**31  # redis-py's own default: a `StreamsCluster` bounds its commands itself
_HOLDING: ContextVar[bool] = ContextVar("holding", default=False)
"""Whether this task runs inside a command or pipeline of a `StreamsCluster` already (redis-py's
pipeline sends the commands a slot's move sent back one by one, through the client)."""


class StreamsCluster(RedisCluster):
    """redis-py 5.3.1's cluster client, with at most `max_connections` commands and pipelines in
    flight at once, and through a master's failover.

    redis-py's own bound is per node, and a command that finds a node's connections all busy fails
    at once (`MaxConnectionsError`): a burst of commands (a thousand readers following at once)
    waits here for one of the process's `max_connections` instead, as `connect`'s pool has it wait.
    The bound is this client's alone, not redis-py's per node, which would count leaked connections:
    redis-py keeps counting a connection whose sending failed as in use, for good (a node dying, or
    a connection closed under a command by the close below), and a node that counted
    `max_connections` of them failed every command for the rest of the process, though it served.
    Such a connection is closed, and holds no socket.

    A connection error has it close every node's connections and read the cluster's layout anew,
    and the node it then asks for the command table is its default node, the master of slot 0:
    while that master is dead, every command of the client would fail, on the healthy masters too.
    The command table is read once (`CommandTableOnce`). And the close drops the default node: a
    pipeline already under way then looks for it (`ClusterPipeline._execute`) and meets None, an
    `AttributeError` no caller would take for a failover; the default node here is then any node
    the client was given. And the nodes it asks for the layout are always the URL's too
    (`keep_seeds`), whichever of them redis-py dropped after their errors.
    """

    def __init__(self, *, startup_nodes: list[ClusterNode], max_connections: int, **kwargs: Any) -> None:
        super().__init__(startup_nodes=startup_nodes, max_connections=UNBOUNDED_PER_NODE, **kwargs)
        self.in_flight = asyncio.Semaphore(max_connections)
        self._seeds = [(node.host, int(node.port)) for node in startup_nodes]

    def keep_seeds(self) -> None:
        """Put back among the nodes to ask for the cluster's layout every node the URL named. redis-py
        drops a node from them at each connection error of a command to it, and its map can name fewer
        nodes than the URL does: after a master's failover the client otherwise ran out of nodes to
        ask ("Redis Cluster cannot be connected") while most of them served."""
        manager = self.nodes_manager
        for host, port in self._seeds:
            if get_node_name(host, port) not in manager.startup_nodes:
                seed = ClusterNode(host, port, **self.connection_kwargs)
                manager.startup_nodes[seed.name] = seed

    async def initialize(self) -> StreamsCluster:
        if self._initialize:  # about to map the nodes anew
            self.keep_seeds()
        await super().initialize()
        return self

    async def execute_command(self, *args: Any, **kwargs: Any) -> Any:
        if _HOLDING.get():
            return await super().execute_command(*args, **kwargs)
        async with self.in_flight:
            holding = _HOLDING.set(True)
            try:
                return await super().execute_command(*args, **kwargs)
            finally:
                _HOLDING.reset(holding)

    def pipeline(self, transaction: Any | None = None, shard_hint: Any | None = None) -> ClusterPipeline:
        if transaction or shard_hint:
            return super().pipeline(transaction, shard_hint)  # which refuses them
        return BoundedPipeline(self)  # type: ignore[abstract]  # redis-py's types call it abstract

    def get_default_node(self) -> ClusterNode:
        default: ClusterNode | None = self.nodes_manager.default_node
        return default if default is not None else next(iter(self.nodes_manager.startup_nodes.values()))


class BoundedPipeline(ClusterPipeline):
    """A pipeline of a `StreamsCluster`, in flight as one of its commands."""

    async def execute(self, raise_on_error: bool = True, allow_redirections: bool = True) -> list[Any]:
        client = self._client
        assert isinstance(client, StreamsCluster)
        async with client.in_flight:
            holding = _HOLDING.set(True)
            try:
                return await super().execute(raise_on_error, allow_redirections)
            finally:
                _HOLDING.reset(holding)


async def close_cluster(cluster: RedisCluster) -> None:
    """Close every connection of a cluster client. redis-py's `aclose` does nothing while the client
    is to read the cluster's layout anew (after a connection error closed it), though the nodes it
    has mapped since may have connections open."""
    await cluster.aclose()
    await cluster.nodes_manager.aclose()
    await cluster.nodes_manager.aclose("startup_nodes")


async def remap_cluster(cluster: StreamsCluster) -> None:
    """Have a cluster client read the cluster's layout anew, and close the connections of the node
    objects its new map replaced: redis-py makes a new object of every node and closes the old ones'
    connections in tasks it keeps no hold of, which the garbage collector may take first."""
    cluster.keep_seeds()
    manager = cluster.nodes_manager
    before = {id(node): node for node in (*manager.nodes_cache.values(), *manager.startup_nodes.values())}
    await manager.initialize()
    kept = {id(node) for node in (*manager.nodes_cache.values(), *manager.startup_nodes.values())}
    for key, node in before.items():
        if key not in kept:
            with contextlib.suppress(RedisError, OSError):
                await node.disconnect()


class CommandTableOnce(AsyncCommandsParser):
    """redis-py's reader of the COMMAND table, which reads it only the first time it is asked, and asks
    the node of the client's latest map for the keys of a command whose keys move (COMMAND GETKEYS):
    redis-py would keep asking the node it first read the table from, and once that master died,
    every such command failed for good, whichever master held its keys."""

    async def initialize(self, node: ClusterNode | None = None) -> None:
        if not self.commands:
            await super().initialize(node)
        elif node is not None:
            self.node = node


class BlockingSentinelPool(SentinelConnectionPool, aioredis.BlockingConnectionPool):
    """redis-py's Sentinel pool (each new connection asks the Sentinels for the master), bounded
    and waiting for a free connection as the plain pool does; it closes its Sentinel clients with
    its connections."""

    async def disconnect(self, inuse_connections: bool = True) -> None:
        await super().disconnect(inuse_connections)
        if inuse_connections:  # the pool closes; a master change disconnects only idle connections
            for sentinel in self.sentinel_manager.sentinels:
                await sentinel.aclose()


def connection_pool(
    url: str,
    name: str,
    max_connections: int,
    *,
    sentinel_password: str | None = None,
) -> aioredis.ConnectionPool:
    """At most `max_connections` connections to the master `url` names (a plain or a Sentinel
    URL), named `name` in CLIENT LIST; a command waits `POOL_WAIT_SECONDS` for a free one."""
    options: dict[str, Any] = {
        "max_connections": max_connections,
        "timeout": POOL_WAIT_SECONDS,
        "decode_responses": True,
        "health_check_interval": 30,
        "client_name": name,
    }
    if not is_sentinel(url):
        return aioredis.BlockingConnectionPool.from_url(url, connection_class=FailoverConnection, **options)
    target = parse_sentinel_url(url)
    sentinels = Sentinel(  # type: ignore[no-untyped-call]
        target.sentinels,
        sentinel_kwargs={
            "password": sentinel_password,
            "socket_timeout": SENTINEL_TIMEOUT_SECONDS,
            "socket_connect_timeout": SENTINEL_TIMEOUT_SECONDS,
        },
    )
    return BlockingSentinelPool(  # type: ignore[no-untyped-call]
        target.master,
        sentinels,
        connection_class=SentinelConnection,
        db=target.db,
        username=target.username,
        password=target.password,
        **options,
    )


def connect(
    url: str, name: str, max_connections: int, *, sentinel_password: str | None = None
) -> aioredis.Redis:
    """A client whose commands share at most `max_connections` connections, named `name` in CLIENT LIST.

    A burst of concurrent commands (a thousand SSE clients connecting at once) waits for a free
    connection instead of opening one apiece, so a process's connections to Redis stay bounded
    whatever its load; a command that waits `POOL_WAIT_SECONDS` in vain fails as Redis unreachable.
    Connections are made lazily and re-made after an outage or a failover; the client answers `str`.
    """
    pool = connection_pool(url, name, max_connections, sentinel_password=sentinel_password)
    client: aioredis.Redis = aioredis.Redis.from_pool(pool)
    return client


def connect_reader(url: str, name: str, *, sentinel_password: str | None = None) -> aioredis.Redis:
    """A client of one connection of its own, for a long blocking reader, named `name` in CLIENT LIST."""
    return connect(url, name, 1, sentinel_password=sentinel_password)


def connect_cluster(url: str, name: str, max_connections: int) -> StreamsCluster:
    """A client of the Redis Cluster whose nodes the `redis[s]+cluster://` URL `url` names, with at most
    `max_connections` commands in flight (a burst waits its turn, as with `connect`), named `name` in
    CLIENT LIST; it answers `str`.

    While a slot moves, commands sent to it at once may fail (`ClusterError`, "TTL exhausted"):
    redis-py sends ASKING on one connection of the new owner and the command on whichever is free.
    """
    target = parse_cluster_url(url)
    client: StreamsCluster = StreamsCluster(  # type: ignore[abstract]  # redis-py's types call it abstract
        startup_nodes=[ClusterNode(host, port) for host, port in target.nodes],
        username=target.username,
        password=target.password,
        max_connections=max_connections,
        decode_responses=True,
        health_check_interval=30,
        client_name=name,
        **target.connection_options(),
        # By default redis-py asks for the whole layout again at every fifth MOVED, closing every
        # connection first, those with a command in flight too, and sends those commands again: a
        # write would run twice. A MOVED alone updates the slot it names.
        reinitialize_steps=0,
    )
    client.commands_parser = CommandTableOnce()
    # redis-py's cluster client takes no connection class: it names its own in the options every
    # node's connections are made from (shared by the nodes it learns later), and has made its seed
    # nodes with it already.
    connection_class = ClusterConnection if target.tls is None else ClusterTlsConnection
    client.connection_kwargs["connection_class"] = connection_class
    for node in client.nodes_manager.startup_nodes.values():
        node.connection_class = connection_class
    return client


StreamsRedis = aioredis.Redis | RedisCluster
"""A client of the job streams' Redis (`streams_redis_url`): one server, or a Redis Cluster."""


def connect_streams(
    url: str, name: str, max_connections: int, *, sentinel_password: str | None = None
) -> StreamsRedis:
    """`connect`, or `connect_cluster` for a `redis+cluster://` URL."""
    if is_cluster(url):
        return connect_cluster(url, name, max_connections)
    return connect(url, name, max_connections, sentinel_password=sentinel_password)


def backend_error(exc: RedisError | OSError) -> BackendUnavailable:
    """What a Redis failure means to streampool: always `BackendUnavailable` (503 with Retry-After at
    the gateway; on a worker, hand the job back or try again), with a message that says which.

    Out of memory (`maxmemory` with `noeviction`) and read-only (a replica, after a failover) pass
    once Redis has room or a master again. Any other refusal (a WRONGTYPE, an ACL) is a fault of
    the deployment or of streampool, never of the request, and no client input can cause one (job
    ids and cursors are checked before they reach Redis): it too is a backend that cannot serve.
    """
    if isinstance(exc, RedisConnectionError | RedisTimeoutError | OSError):
        return BackendUnavailable(f"Redis is unreachable: {exc}")
    if isinstance(exc, OutOfMemoryError):
        return BackendUnavailable(f"Redis is out of memory: {exc}")
    if isinstance(exc, ReadOnlyError):
        return BackendUnavailable(f"Redis is read-only (a replica; is a failover under way?): {exc}")
    return BackendUnavailable(f"Redis refused the command: {exc}")


@contextmanager
def redis_errors() -> Iterator[None]:
    """The boundary where every redis-py error (and a socket's) becomes `BackendUnavailable`."""
    try:
        yield
    except (RedisError, OSError) as exc:
        raise backend_error(exc) from exc
    except RedisClusterException as exc:  # redis-py's own, of a Redis Cluster: no slot map, no node
        raise BackendUnavailable(f"the Redis Cluster cannot serve the command: {exc}") from exc
