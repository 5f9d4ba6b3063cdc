"""A long-poll at the tip of a stream the gateway's hub watches, answered from what the hub knows of
it without a check in Redis, and checked in Redis whenever what it knows does not settle the poll.

On a private redis-server, because INFO commandstats counts the whole server's commands: the relay's
check is its one script (`cursor_check.lua`), so the server's script calls are its checks. The
streams are written here as the lifecycle's scripts write them, with their notices."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import redis.asyncio as aioredis

from gateway.relay.entries import Entry
from gateway.relay.hub import StreamHub
from gateway.relay.open_streams import StreamLimits
from gateway.relay.relay import Relay
from gateway.relay.server_notices import ServerNotices
from shared.config import GatewaySettings
from shared.errors import JobNotFound
from shared.events import JobState
from shared.keys import Keys
from shared.lifecycle import scripts
from shared.notices import notice_line
from shared.redis_client import connect_reader
from tests.gateway.stand_ins import private_redis
from tests.helpers import eventually, stream_reader_listening

OWNER, OTHER = "owner-a", "owner-b"
JOB = "job-at-tip"
LIMITS = StreamLimits.of(GatewaySettings())
WAIT = 30.0  # a poll's wait: far past every deadline below, so that no answer here is a wait's end
DEADLINE = 10.0


@pytest.fixture
async def relay(tmp_path: Path) -> AsyncIterator[Relay]:
    with private_redis(tmp_path) as url:
        redis = aioredis.Redis.from_url(url, decode_responses=True)
        await redis.script_load(scripts.CURSOR_CHECK.source)
        keys = Keys.of(GatewaySettings(key_prefix="sptest-tip"))
        hub = StreamHub(ServerNotices(connect_reader(url, keys.stream_reader_name), keys))
        await redis.hset(keys.job(JOB), mapping={"status": "running", "owner": OWNER})
        await _append(Relay(redis, keys, hub), "1-1", "status", '{"state":"running"}')
        yield Relay(redis, keys, hub)
        await hub.close()
        await redis.aclose()


async def _append(
    relay: Relay, entry_id: str, kind: str = "delta", data: str = "{}", notice: bool = True
) -> None:
    """An entry as a worker's step appends one: with the notice line that carries it."""
    stream = relay.keys.stream(JOB)
    await relay.redis.xadd(stream, {"type": kind, "data": data, "at": "1700000000000"}, id=entry_id)
    if notice:
        line = notice_line(stream, entry_id, kind, "1700000000000", data)
        await relay.redis.publish(relay.keys.notices_of(JOB), line)


async def _checks(relay: Relay) -> int:
    """How many checks (script calls) the relay has made of Redis so far."""
    stats = await relay.redis.info("commandstats")
    return sum(stats.get(f"cmdstat_{name}", {}).get("calls", 0) for name in ("evalsha", "eval"))


async def _poll(
    relay: Relay, cursor: str, owner: str = OWNER
) -> asyncio.Task[tuple[list[Entry], JobState, bool]]:
    """A poll that waits, started; once it waits, the hub listens and has read what it was due to."""
    polling = asyncio.create_task(relay.page(JOB, cursor, 10, WAIT, owner, LIMITS))
    await eventually(lambda: stream_reader_listening(relay.redis, relay.keys), "the hub listens")
    await eventually(lambda: asyncio.sleep(0, not relay.hub._due), "the hub's reads done", interval=0.01)
    await asyncio.sleep(0.05)  # the poll waits on the hub
    assert not polling.done()
    return polling


async def _answer(
    polling: asyncio.Task[tuple[list[Entry], JobState, bool]],
) -> tuple[list[str], JobState, bool]:
    entries, state, done = await asyncio.wait_for(polling, DEADLINE)
    return [entry.id for entry in entries], state, done


async def _at_the_tip(relay: Relay) -> None:
    """A first poll at the tip, checked in Redis, answered by the next step's entry '2-1': its
    stream watched since, and what the check found known to the hub."""
    polling = await _poll(relay, "1-1")
    await _append(relay, "2-1")
    assert await _answer(polling) == (["2-1"], JobState.running, False)


async def test_the_next_poll_at_the_tip_is_answered_from_the_hub_without_a_check(relay: Relay) -> None:
    await _at_the_tip(relay)
    checks = await _checks(relay)
    for entry_id, cursor in [("3-1", "2-1"), ("4-1", "3-1")]:
        polling = await _poll(relay, cursor)
        await _append(relay, entry_id)
        assert await _answer(polling) == ([entry_id], JobState.running, False)
    assert await _checks(relay) == checks
    assert relay.hub.streams == 1  # watched between polls, lingering


async def test_another_owners_poll_at_the_tip_of_a_known_stream_is_still_not_found(relay: Relay) -> None:
    await _at_the_tip(relay)
    checks = await _checks(relay)
    with pytest.raises(JobNotFound):
        await relay.page(JOB, "2-1", 10, WAIT, OTHER, LIMITS)
    assert await _checks(relay) == checks + 1


async def test_a_cursor_ahead_of_the_hub_gets_its_entries_from_redis(relay: Relay) -> None:
    """A cursor from another gateway whose hub heard of entries this one has not read yet."""
    await _at_the_tip(relay)
    await _append(relay, "3-1", notice=False)
    await _append(relay, "4-1", notice=False)
    checks = await _checks(relay)
    entries, state, done = await relay.page(JOB, "3-1", 10, WAIT, OWNER, LIMITS)
    assert ([entry.id for entry in entries], state, done) == (["4-1"], JobState.running, False)
    assert await _checks(relay) == checks + 1


async def test_a_poll_at_a_tip_the_hub_has_not_read_to_waits_from_its_own_cursor(relay: Relay) -> None:
    """The poll's check finds its cursor at the stream's end, where the hub, watching the stream from
    an earlier entry, has not read to yet: the next entry is read with the one the hub missed, and
    the poll is answered only what comes after its cursor."""
    await _at_the_tip(relay)
    await _append(relay, "3-1", notice=False)
    polling = await _poll(relay, "3-1")
    await _append(relay, "4-1")
    assert await _answer(polling) == (["4-1"], JobState.running, False)


async def test_a_poll_waiting_at_the_tip_is_answered_at_once_when_the_gateway_stops(relay: Relay) -> None:
    """As `GatewayServer.shutdown` ends the open streams: the poll answers with nothing new, long
    before its wait is over, and its client polls again elsewhere from the same cursor."""
    await _at_the_tip(relay)
    polling = await _poll(relay, "2-1")
    relay.open_streams.close()
    assert await _answer(polling) == ([], JobState.running, False)


async def test_a_job_that_ends_while_a_poll_waits_at_the_tip_answers_done(relay: Relay) -> None:
    await _at_the_tip(relay)
    checks = await _checks(relay)
    polling = await _poll(relay, "2-1")
    await relay.redis.hset(
        relay.keys.job(JOB), "status", "completed"
    )  # with its terminal entry, as ending writes
    await _append(relay, "3-1", "done")
    assert await _answer(polling) == (["3-1"], JobState.completed, True)
    assert await _checks(relay) == checks
    # The hub saw the end: a poll after it goes to Redis, which says the job is done.
    entries, state, done = await relay.page(JOB, "3-1", 10, WAIT, OWNER, LIMITS)
    assert (entries, state, done) == ([], JobState.completed, True)
    assert await _checks(relay) == checks + 1


async def test_after_the_hubs_connection_drops_the_next_poll_is_checked_in_redis(relay: Relay) -> None:
    """The notices' connection alone dropped: the hub listens again and has read its streams since, but
    what it knew from before it forgot (notices were missed meanwhile)."""
    await _at_the_tip(relay)
    killed = await _listener(relay)
    await relay.redis.client_kill_filter(_id=killed)

    async def listening_anew() -> bool:
        return await _listener(relay) not in ("", killed)

    await eventually(listening_anew, "the hub listens on a new connection")
    checks = await _checks(relay)
    polling = await _poll(relay, "2-1")
    assert await _checks(relay) == checks + 1
    await _append(relay, "3-1")
    assert await _answer(polling) == (["3-1"], JobState.running, False)


async def _listener(relay: Relay) -> str:
    """The id of the hub's connection that listens to the notices ('' for none)."""
    clients = await relay.redis.client_list()
    name = relay.keys.stream_reader_name
    return next((c["id"] for c in clients if c["name"] == name and c["sub"] != "0"), "")


async def test_a_stream_watched_only_to_linger_is_dropped_after_the_linger(
    relay: Relay, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("gateway.relay.hub.LINGER_SECONDS", 0.2)
    await _at_the_tip(relay)

    async def dropped() -> bool:
        return relay.hub.streams == 0

    await eventually(dropped, "the lingering stream dropped", interval=0.01)


async def test_what_a_check_found_is_checked_again_after_its_time(
    relay: Relay, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A running job's record can go with no entry to say so: however many polls what a check found
    answers, it is checked in Redis again `CHECKED_SECONDS` after."""
    monkeypatch.setattr("gateway.relay.hub.CHECKED_SECONDS", 0.3)
    await _at_the_tip(relay)
    await asyncio.sleep(0.3)
    checks = await _checks(relay)
    polling = await _poll(relay, "2-1")
    assert await _checks(relay) == checks + 1
    await _append(relay, "3-1")
    assert await _answer(polling) == (["3-1"], JobState.running, False)
