"""Where a job's stream lives beside its record, chosen once at start: the seam of the transitions.

`OneRedis`: one Redis holds everything, and each transition is its one control-plane script, which
writes the stream too. `StreamsApart` (`streams_redis_url`): the streams (the data plane) have a Redis
of their own, and each transition that writes a stream has a part there, before or after its
script's, in the order that keeps the job whole should the caller stop between the two
(`shared.lifecycle`'s table). `Transitions` calls the seam at those points and never asks which one
it has.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Collection
from dataclasses import dataclass, replace
from typing import Any

import redis.asyncio as aioredis

from shared.events import ErrorEvent, event_json
from shared.keys import JobKeys, Keys
from shared.lifecycle import scripts
from shared.lifecycle.arguments import (
    Notices,
    StreamEndArgs,
    StreamOpenArgs,
    StreamTakeArgs,
    WriterMarkArgs,
)
from shared.redis_client import StreamsRedis

PUBLISH = "PUBLISH"
SHARD_PUBLISH = "SPUBLISH"  # on a Redis Cluster: to the subscribers of the master of the channel's slot


@dataclass(frozen=True)
class Lifecycle:
    """What every transition of a store's jobs takes alike, fixed at start: a stream's cap (`maxlen`),
    how long an ended job's keys stay (`retention_seconds`) and a live job's live
    (`lifetime_seconds`), and how many newest jobs the job index keeps (0: none is indexed)."""

    maxlen: int
    retention_seconds: int
    lifetime_seconds: int
    index_size: int = 0


@dataclass(frozen=True)
class Taken:
    """What the data plane answers a start: 'running', 'resumed', 'ended' or 'missing', and a
    resumed or ended job's stream entries as the script read them (None: the control plane's)."""

    outcome: str
    entries: list[Any] | None = None


class Planes(ABC):
    """The part of each transition that is the stream's, where the stream is not the record's Redis."""

    def __init__(self, streams: StreamsRedis, keys: Keys, lifecycle: Lifecycle) -> None:
        self.streams = streams
        self.keys = keys
        self.lifecycle = lifecycle
        self.between_planes: Callable[[str], None] | None = None
        """A fault hook, for tests: called with the transition's name between its write on one Redis
        and its write on the other (streams apart), where a test stops the caller (raises) as a crash
        would."""

    def between(self, transition: str) -> None:
        """The point between a transition's two writes (`between_planes`)."""
        if self.between_planes is not None:
            self.between_planes(transition)

    @abstractmethod
    def control(self, job: JobKeys) -> JobKeys:
        """A job's keys as the control plane's scripts take them."""

    @abstractmethod
    def fence(self, job_id: str) -> str:
        """The key whose holder a step must be: the job's lease, or its writer apart."""

    @abstractmethod
    def recorded_end(self, events: list[tuple[str, str]]) -> list[tuple[str, str]]:
        """Of a worker's last events, those the finish script writes."""

    @abstractmethod
    def end_of_stream(
        self, job_id: str, worker_id: str, events: list[tuple[str, str]]
    ) -> tuple[Any, ...] | None:
        """A worker's end of the stream as a pipeline command, sent before the record's; None: the
        finish script ends both."""

    @abstractmethod
    async def open(self, job_id: str, queued_event: str, lifetime_seconds: int) -> bool:
        """Before a submission's record: its stream, where it has a Redis of its own (made: True)."""

    @abstractmethod
    async def refused(self, job_id: str) -> None:
        """A submission made no record: the stream `open` made goes."""

    @abstractmethod
    async def take(self, job_id: str, worker_id: str, asked: str, running_event: str | None) -> Taken:
        """After a start's record: the job's stream taken by `worker_id`."""

    @abstractmethod
    async def expired(self, transition: str, job_id: str, expired: ErrorEvent, now: float) -> None:
        """After `transition` ended a queued job past its deadline: its stream ends."""

    @abstractmethod
    async def ask_cancel(self, job_id: str, now: float) -> None:
        """Before a cancel's record, for a running job: its writer carries the ask."""

    @abstractmethod
    async def cancelled(
        self, job_id: str, ended: bool, worker: str | None, event: tuple[str, str], now: float
    ) -> None:
        """After a cancel's record: the stream of a job it `ended` ends; the writer of a job no worker
        holds (`worker` last ran it) goes, before its caller reads the stream."""

    @abstractmethod
    async def deleted(self, job_id: str) -> None:
        """After a deletion's record: the stream goes."""

    @abstractmethod
    async def renewed(self, job_ids: Collection[str]) -> None:
        """After a renewal: the streams of `job_ids` live a job lifetime from now."""

    @abstractmethod
    async def released(
        self, job_id: str, outcome: str, holder: str, failed: ErrorEvent | None, now: float
    ) -> None:
        """After a release's record (`outcome`, `holder` the worker that held the job): a requeued or
        exhausted job's writer goes, a failed job's stream ends."""


class OneRedis(Planes):
    """One Redis holds the records and the streams: each control-plane script writes both."""

    def control(self, job: JobKeys) -> JobKeys:
        return job

    def fence(self, job_id: str) -> str:
        return self.keys.lease(job_id)

    def recorded_end(self, events: list[tuple[str, str]]) -> list[tuple[str, str]]:
        return events

    def end_of_stream(
        self, job_id: str, worker_id: str, events: list[tuple[str, str]]
    ) -> tuple[Any, ...] | None:
        return None

    async def open(self, job_id: str, queued_event: str, lifetime_seconds: int) -> bool:
        return False

    async def refused(self, job_id: str) -> None:
        return None

    async def take(self, job_id: str, worker_id: str, asked: str, running_event: str | None) -> Taken:
        return Taken("running")

    async def expired(self, transition: str, job_id: str, expired: ErrorEvent, now: float) -> None:
        return None

    async def ask_cancel(self, job_id: str, now: float) -> None:
        return None

    async def cancelled(
        self, job_id: str, ended: bool, worker: str | None, event: tuple[str, str], now: float
    ) -> None:
        return None

    async def deleted(self, job_id: str) -> None:
        return None

    async def renewed(self, job_ids: Collection[str]) -> None:
        return None

    async def released(
        self, job_id: str, outcome: str, holder: str, failed: ErrorEvent | None, now: float
    ) -> None:
        return None


class StreamsApart(Planes):
    """The streams on a Redis of their own: a job's lease is mirrored there by its writer
    (`Keys.writer`), and an end no worker makes is kept in the record (`end_event.lua`) until the
    stream has it too."""

    def control(self, job: JobKeys) -> JobKeys:
        return replace(job, stream="")

    def fence(self, job_id: str) -> str:
        return self.keys.writer(job_id)

    def recorded_end(self, events: list[tuple[str, str]]) -> list[tuple[str, str]]:
        return events[-1:]  # the terminal one, for the record

    def _ends(self, job_id: str) -> list[str]:
        return _stream_ends(self.keys, job_id)

    def end_of_stream(
        self, job_id: str, worker_id: str, events: list[tuple[str, str]]
    ) -> tuple[Any, ...] | None:
        ending: StreamEndArgs = {
            "holder": worker_id,
            "asked_at": "",
            "events": events,
            "maxlen": self.lifecycle.maxlen,
            "retention": self.lifecycle.retention_seconds,
            **_notices_of(self.keys, job_id),
        }
        return scripts.STREAM_END.eval_command(self._ends(job_id), ending)

    async def _end(
        self, job_id: str, events: list[tuple[str, str]], *, maxlen: int | None, now: float
    ) -> None:
        """`end_stream`, after the record's end, with the retention of an ended job."""
        await end_stream(
            self.streams,
            self.keys,
            job_id,
            events,
            maxlen=maxlen,
            retention_seconds=self.lifecycle.retention_seconds,
            now=now,
        )

    async def drop_writer(self, job_id: str, holder: str, lifetime_seconds: int | None = None) -> None:
        """Once the job is taken from `holder`: its writer goes."""
        keys = [self.keys.writer(job_id), self.keys.stream(job_id)]
        await scripts.WRITER_DROP(self.streams, keys, {"holder": holder, "lifetime": lifetime_seconds})

    async def open(self, job_id: str, queued_event: str, lifetime_seconds: int) -> bool:
        opening: StreamOpenArgs = {
            "queued_event": queued_event,
            "maxlen": self.lifecycle.maxlen,
            "lifetime": lifetime_seconds,
        }
        opened = bool(await scripts.STREAM_OPEN(self.streams, [self.keys.stream(job_id)], opening))
        self.between("submit")
        return opened

    async def refused(self, job_id: str) -> None:
        await self.streams.delete(self.keys.stream(job_id))  # no record was made: nothing names this stream

    async def take(self, job_id: str, worker_id: str, asked: str, running_event: str | None) -> Taken:
        self.between("start")
        # The writer after the lease, and the stream read after the writer: nothing an earlier
        # worker appends can come after this reading.
        taking: StreamTakeArgs = {
            "worker": worker_id,
            "asked_at": asked or None,
            "running_event": running_event,
            "lifetime": self.lifecycle.lifetime_seconds,
            "maxlen": self.lifecycle.maxlen,
            **_notices_of(self.keys, job_id),
        }
        taken, *read = await scripts.STREAM_TAKE(self.streams, self._ends(job_id), taking)
        return Taken(taken, read[0] if read else None)

    async def expired(self, transition: str, job_id: str, expired: ErrorEvent, now: float) -> None:
        self.between(transition)
        ending: list[tuple[str, str]] = [(expired.type, event_json(expired))]
        await self._end(job_id, ending, maxlen=self.lifecycle.maxlen, now=now)

    async def ask_cancel(self, job_id: str, now: float) -> None:
        # The writer of a running job carries the ask first: should the caller stop before the
        # record has it, the worker's next step ends the job all the same.
        marking: WriterMarkArgs = {"asked_at": repr(now)}
        await scripts.WRITER_MARK(self.streams, [self.keys.writer(job_id)], marking)
        self.between("cancel asked")

    async def cancelled(
        self, job_id: str, ended: bool, worker: str | None, event: tuple[str, str], now: float
    ) -> None:
        self.between("cancel")
        if ended:
            await self._end(job_id, [event], maxlen=None, now=now)
        elif worker:
            await self.drop_writer(job_id, worker)

    async def deleted(self, job_id: str) -> None:
        self.between("delete")
        await self.streams.delete(*self._ends(job_id))

    async def renewed(self, job_ids: Collection[str]) -> None:
        lifetime = self.lifecycle.lifetime_seconds
        async with self.streams.pipeline(transaction=False) as pipe:
            for job_id in job_ids:
                pipe.expire(self.keys.stream(job_id), lifetime)
                pipe.expire(self.keys.writer(job_id), lifetime)
            await pipe.execute()

    async def released(
        self, job_id: str, outcome: str, holder: str, failed: ErrorEvent | None, now: float
    ) -> None:
        # After the record's: the job is no longer the worker's, nor its stream.
        self.between("release")
        if outcome == "requeued" and holder:
            await self.drop_writer(job_id, holder, self.lifecycle.lifetime_seconds)
        elif outcome == "exhausted" and holder:
            await self.drop_writer(job_id, holder)
        elif outcome == "failed" and failed is not None:
            ending: list[tuple[str, str]] = [(failed.type, event_json(failed))]
            await self._end(job_id, ending, maxlen=self.lifecycle.maxlen, now=now)


def planes_of(
    redis: aioredis.Redis, keys: Keys, lifecycle: Lifecycle, streams: StreamsRedis | None
) -> Planes:
    """The seam for a store: the streams apart when they have a Redis of their own."""
    if streams is None:
        return OneRedis(redis, keys, lifecycle)
    return StreamsApart(streams, keys, lifecycle)


def _notices_of(keys: Keys, job_id: str) -> Notices:
    """Where a data-plane script tells of its appends to the job's stream, and how."""
    publish = SHARD_PUBLISH if keys.partitions else PUBLISH
    return {"publish": publish, "notices": keys.notices_of(job_id)}


def _stream_ends(keys: Keys, job_id: str) -> list[str]:
    """The data plane's keys of a job: its stream and its writer."""
    return [keys.stream(job_id), keys.writer(job_id)]


async def end_stream(
    streams: StreamsRedis,
    keys: Keys,
    job_id: str,
    events: list[tuple[str, str]],
    *,
    maxlen: int | None,
    retention_seconds: int,
    now: float,
) -> str:
    """With the streams apart, the end of a job no worker ends (a cancel, a deadline, a job out of
    attempts), after its record's, with its terminal event, (type, data): `stream_end.lua`'s answer.
    `maxlen` None: the stream is not trimmed. A gateway's reader calls it too, for a stream its end
    never reached (`gateway.relay.relay.HEAL_SECONDS`)."""
    args: StreamEndArgs = {
        "holder": None,
        "asked_at": repr(now),
        "events": events,
        "maxlen": maxlen,
        "retention": retention_seconds,
        **_notices_of(keys, job_id),
    }
    answer: list[Any] = await scripts.STREAM_END(streams, _stream_ends(keys, job_id), args)
    return str(answer[0])
