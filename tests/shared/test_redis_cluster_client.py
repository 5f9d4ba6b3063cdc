"""`connect_cluster`'s client on a real Redis Cluster (three masters and their replicas, `redis-server`
processes of the module's own): it reaches every master, runs multi-key commands and scripts on keys of
one hash tag, finds a key again once its master was SIGKILLed and the replica promoted, and loses no
write while the key's slot moves from one master to another.

What redis-py does on its own: it follows MOVED and ASK (the command is sent again to the node named,
after ASKING for an ASK) without raising. On a dead master it tries again (connecting, and asking the
nodes for the cluster's layout anew) three times within about 0.1 s, then raises `ConnectionError`: a
failover takes seconds (the node timeout and an election), so the caller tries again until the replica
is promoted; the first command after that reaches it.

The writer of the slot's move has one command in flight, as a loop does: with several at once, redis-py
5.3.1 sends ASKING on one connection of the new owner and the command on another (each takes a free
one), the owner sends the command back (MOVED) and the old owner forward (ASK) until redis-py gives up
("TTL exhausted"); and with its default `reinitialize_steps` it closes every connection, those with a
command in flight too, at every fifth MOVED, and sends those commands again: a write runs twice.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator

import pytest
import redis
from redis.asyncio.cluster import RedisCluster
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import NoScriptError, RedisClusterException

from shared.redis_client import ClusterConnection, connect_cluster
from tests.redis_cluster import ClusteredRedis

MAX_CONNECTIONS = 8
NAME = "cluster-test"
RETRY_SECONDS = 0.05
FAILOVER_SECONDS = 30  # a promotion takes seconds; on a loaded machine, some more
WRITES_AFTER_MOVE = 100
SCRIPT = "redis.call('SET', KEYS[1], ARGV[1]); return redis.call('INCRBY', KEYS[2], ARGV[2])"


@pytest.fixture
async def client(redis_cluster: ClusteredRedis) -> AsyncIterator[RedisCluster]:
    cluster = connect_cluster(redis_cluster.url, NAME, MAX_CONNECTIONS)
    yield cluster
    await cluster.aclose()


def tagged(tag: str, part: str) -> str:
    return f"{{{tag}}}:{part}"


def key_on(cluster: ClusteredRedis, master: str) -> str:
    """A key of this test's own that `master` serves."""
    while True:
        key = f"cluster-test:{uuid.uuid4().hex}"
        if cluster.master_of(key) == master:
            return key


async def test_the_client_reaches_a_key_on_every_master(
    client: RedisCluster, redis_cluster: ClusteredRedis
) -> None:
    masters = redis_cluster.masters()
    assert len(masters) == 3
    for master in masters:
        key = key_on(redis_cluster, master)
        assert await client.set(key, master)
        assert await client.get(key) == master
        with redis_cluster.client(master) as node:
            assert node.get(key) == master  # on that master itself
            assert any(entry["name"] == NAME for entry in node.client_list())
    for node in client.get_nodes():
        assert node.connection_class is ClusterConnection


async def test_a_multi_key_command_and_a_script_run_on_keys_of_one_hash_tag(client: RedisCluster) -> None:
    tag = uuid.uuid4().hex
    first, second = tagged(tag, "first"), tagged(tag, "second")
    assert await client.mset({first: "1", second: "2"})
    assert await client.mget(first, second) == ["1", "2"]
    sha = await client.script_load(SCRIPT)  # on every master: whichever serves the tag has it
    assert await client.evalsha(sha, 2, first, second, "set", "5") == 7  # type: ignore[misc]
    assert await client.mget(first, second) == ["set", "7"]
    # Keys of different slots are refused by the client itself, before any node sees the command, with
    # an exception that is no RedisError.
    with pytest.raises(RedisClusterException, match="same key slot"):
        await client.mget(first, f"other-{tag}")
    assert not issubclass(RedisClusterException, redis.RedisError)


async def test_a_key_is_read_and_written_again_once_its_master_was_killed(
    client: RedisCluster, redis_cluster: ClusteredRedis
) -> None:
    """The master of slot 0 is the one killed: the client's first map made it its default node, which
    redis-py asks for the keys of commands whose keys move (XREAD): they reach their masters after."""
    master = next(name for name, view in redis_cluster.nodes().items() if view.is_master and view.serves(0))
    key = key_on(redis_cluster, master)
    elsewhere = key_on(redis_cluster, next(name for name in redis_cluster.masters() if name != master))
    await client.xadd(elsewhere, {"n": "1"}, id="1-1")
    with redis_cluster.client(master) as node:  # one connection: WAIT waits for its own writes
        node.set(key, "before")
        assert node.execute_command("WAIT", 1, 5000) == 1  # the replica holds it
    sha = await client.script_load(SCRIPT)
    replica = redis_cluster.replica_of(master)
    redis_cluster.kill(master)
    try:
        # redis-py alone gives up long before the replica is promoted.
        with pytest.raises(RedisConnectionError):
            await client.get(key)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + FAILOVER_SECONDS
        while True:
            try:
                assert await client.get(key) == "before"
                break
            except RedisConnectionError:
                assert loop.time() < deadline, f"{key} is unreachable {FAILOVER_SECONDS} s after the kill"
                await asyncio.sleep(RETRY_SECONDS)
        assert await client.set(key, "after")
        assert await client.xread({elsewhere: "0"}) == [[elsewhere, [("1-1", {"n": "1"})]]]
        with redis_cluster.client(replica) as node:
            assert node.get(key) == "after"  # the promoted replica serves it
        # Scripts are no data: a replica never received them, so a promoted one has none to run.
        with pytest.raises(NoScriptError):
            await client.evalsha(sha, 2, key, key, "set", "1")  # type: ignore[misc]
    finally:
        await client.delete(elsewhere)
        redis_cluster.restart(master)


async def test_no_write_is_lost_while_its_slot_moves_to_another_master(
    client: RedisCluster, redis_cluster: ClusteredRedis
) -> None:
    tag = uuid.uuid4().hex
    streams = [tagged(tag, f"stream-{n}") for n in range(100)]
    for stream in streams:  # keys already there: the slot moves a batch at a time
        await client.xadd(stream, {"n": -1})
    slot = redis_cluster.slot_of(streams[0])
    source = redis_cluster.master_of(streams[0])
    target = next(master for master in redis_cluster.masters() if master != source)
    redirects_before = errors(redis_cluster, source)
    written: list[int] = []
    moved = asyncio.Event()

    async def write() -> None:
        n, after_move = 0, 0
        while after_move < WRITES_AFTER_MOVE:  # on after the move: the writer meets MOVED
            await client.xadd(streams[n % len(streams)], {"n": n})
            written.append(n)
            n += 1
            after_move += moved.is_set()

    writer = asyncio.create_task(write())
    await asyncio.to_thread(redis_cluster.move_slot, slot, target, batch=5, pause=0.02)
    moved.set()
    await writer

    assert redis_cluster.master_of(streams[0]) == target
    found = [int(fields["n"]) for stream in streams for _, fields in await client.xrange(stream)]
    assert sorted(n for n in found if n >= 0) == written  # every write once, none lost
    redirects = errors(redis_cluster, source)
    assert redirects["ASK"] > redirects_before["ASK"], "no writer met the slot half-moved"
    assert redirects["MOVED"] > redirects_before["MOVED"], "no writer met the slot moved"


def errors(cluster: ClusteredRedis, name: str) -> dict[str, int]:
    """How many of each redirection the node `name` has answered."""
    with cluster.client(name) as node:
        stats = node.info("errorstats")
    return {kind: stats.get(f"errorstat_{kind}", {}).get("count", 0) for kind in ("ASK", "MOVED")}


async def test_a_burst_past_max_connections_waits_for_a_free_one_instead_of_failing(
    redis_cluster: ClusteredRedis,
) -> None:
    """redis-py alone fails a command that finds its node's connections all busy (MaxConnectionsError):
    `connect_cluster`'s client has a burst of commands and pipelines wait their turn, every one answered."""
    client = connect_cluster(redis_cluster.url, NAME, 2)
    key = f"burst:{uuid.uuid4().hex}"
    try:

        async def pipelined(n: int) -> list[object]:
            pipe = client.pipeline()
            pipe.incr(key)
            pipe.get(key)
            return list(await pipe.execute())

        answers = await asyncio.gather(
            *(client.incr(key) for _ in range(50)), *(pipelined(n) for n in range(50))
        )
        assert await client.get(key) == "100"
        assert len(answers) == 100
    finally:
        await client.delete(key)
        await client.aclose()


async def test_the_client_maps_the_cluster_from_the_urls_nodes_whichever_redis_py_dropped(
    redis_cluster: ClusteredRedis,
) -> None:
    """redis-py drops a node from those it asks for the cluster's layout at each connection error of a
    command to it; after a failover's errors it had none left, and every command failed ("Redis
    Cluster cannot be connected") while the cluster served. Emptying that list stands for those errors
    here, as causing them takes killing nodes: the client still maps the cluster from the URL's nodes."""
    client = connect_cluster(redis_cluster.url, NAME, MAX_CONNECTIONS)
    key = f"seeds:{uuid.uuid4().hex}"
    try:
        await client.set(key, "1")
        client.nodes_manager.startup_nodes.clear()
        await client.aclose()  # as after a connection error: the next command maps the cluster anew
        assert await client.get(key) == "1"
        assert len(client.nodes_manager.startup_nodes) == len(redis_cluster.live())
    finally:
        await client.delete(key)
        await client.aclose()


async def test_connections_redis_py_leaks_leave_a_node_serving(redis_cluster: ClusteredRedis) -> None:
    """redis-py counts a connection whose send failed as in use for good; with its per-node bound, a
    node that leaked `max_connections` of them failed every command after, while it served. Taking
    connections and never giving them back stands for those failures here (causing them takes a node
    dying under the commands): the client's commands still reach the node."""
    client = connect_cluster(redis_cluster.url, NAME, 2)
    key = f"leak:{uuid.uuid4().hex}"
    try:
        await client.set(key, "1")
        node = client.get_node_from_key(key)
        leaked = [node.acquire_connection() for _ in range(4)]
        assert await client.get(key) == "1"
        for connection in leaked:
            await connection.disconnect()
    finally:
        await client.delete(key)
        await client.aclose()
