"""Acknowledging only what a failover keeps: Redis's WAIT after a write, in the write's round trip.

Redis replicates asynchronously: a write the master answered may die with it. A submission, a
cancel and a job's end are acknowledged (a 202, a job's slot freed) only once `Wait.replicas`
replicas hold them: the WAIT goes in the same pipeline as the write's script, so it costs no round
trip of its own, only the time the replicas take to acknowledge (measured in bench/REPLICA_ACK.md).

WAIT counts only the writes of its own connection, and a script sent again finds its work done and
writes nothing: a submission retried with its idempotency key, a cancel asked twice, a job's end sent
again on another pooled connection than the first sending's. So a WAIT follows a write of its own
(the replication fence key): the replicas that acknowledge that hold every earlier write too, on
whatever connection it was made, since a master replicates its writes in the order it made them.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import redis.asyncio as aioredis

from shared.errors import BackendUnavailable
from shared.redis_client import redis_errors

# How long the number of replicas a master has is taken as known: a replica that joins is counted
# this soon (or at once after a WAIT fell short); one INFO per process this often.
REPLICAS_CHECK_SECONDS = 5.0
SEEN_MEMBER = "replicas"  # the one member of `Keys.replicas_seen`


@dataclass(frozen=True)
class Wait:
    """WAIT for `replicas` replicas, `timeout_ms` at most, after a write to `fence`."""

    replicas: int
    timeout_ms: int
    fence: str

    @property
    def commands(self) -> tuple[tuple[Any, ...], ...]:
        """The fence's write, then the WAIT (whose answer is the count of replicas holding both)."""
        return (("SET", self.fence, "1"), ("WAIT", self.replicas, self.timeout_ms))


class ReplicaAcks:
    """How many replicas must hold a write before it is acknowledged: `min_replicas_to_ack`, or, with
    that unset, one once the deployment has been seen with a replica, whatever its state.

    One is enough for a failover to lose nothing acknowledged: Sentinel promotes the replica that
    holds the most of the master's writes, so a write one replica holds survives the master's loss
    (asking for more survives more failures at once, but stops writes while any of them is down). A
    replica is counted from the moment the master lists it (`connected_slaves` of `INFO
    replication`), still syncing or not: until it holds the write, a WAIT for it falls short. What
    was seen never goes away by itself: a master that lost its replicas (one cut off from them while
    a replica was promoted, or a new master whose old one has not come back) is one whose writes a
    failover can lose, so it acknowledges nothing until a replica holds the write again. The most
    replicas seen is kept in the process and on the master (`Keys.replicas_seen`), so that a process
    started later knows it too; only `min_replicas_to_ack` asks for fewer.

    The count is read at first use, again every `REPLICAS_CHECK_SECONDS`, and at once after a WAIT
    fell short. A single Redis that never had a replica acknowledges at once.
    """

    def __init__(
        self, redis: aioredis.Redis, replicas: int | None, timeout_ms: int, fence: str, seen_key: str
    ) -> None:
        self.redis = redis
        self.fixed = replicas
        self.timeout_ms = timeout_ms
        self.fence = fence
        self.seen_key = seen_key
        self._seen = 0
        self._known_until = 0.0

    async def wait(self) -> Wait | None:
        """The WAIT a write is to be followed by now; None when no replica need hold it."""
        replicas = self.fixed if self.fixed is not None else await self._needed_now()
        return Wait(replicas, self.timeout_ms, self.fence) if replicas else None

    def check(self, wait: Wait | None, acked: int | None, what: str, then: str = "") -> None:
        """`BackendUnavailable` unless as many replicas as `wait` asked for acknowledged `what`;
        `then` says what the client may do about it."""
        if wait is None or (acked is not None and acked >= wait.replicas):
            return
        self._known_until = 0.0
        raise BackendUnavailable(
            f"{what} reached {acked or 0} of the {wait.replicas} Redis replicas it needs within "
            f"{wait.timeout_ms} ms (a failover, or a replica down){then}"
        )

    async def _needed_now(self) -> int:
        now = time.monotonic()
        if now >= self._known_until:
            with redis_errors():
                async with self.redis.pipeline(transaction=False) as pipe:
                    pipe.info("replication")
                    pipe.zscore(self.seen_key, SEEN_MEMBER)
                    info, stored = await pipe.execute()
                kept = int(stored or 0)
                self._seen = max(self._seen, kept, int(info.get("connected_slaves", 0)))
                if self._seen > kept:  # written only when it grows: ZADD GT keeps the highest
                    await self.redis.zadd(self.seen_key, {SEEN_MEMBER: self._seen}, gt=True)
            self._known_until = now + REPLICAS_CHECK_SECONDS
        return min(self._seen, 1)
