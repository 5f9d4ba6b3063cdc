"""The whole system with the job streams on a Redis Cluster (three masters and a replica of each, the
module's own), the rest on the suite's Redis: two gateways and two synthetic workers, driven through the
HTTP API by real clients (SSE, long-poll, the `openai` package), each job submitted through one gateway
and followed or resumed through the other, and a third gateway of keyed tenants. Jobs land on every
master; a slot moved under load and a master SIGKILLed mid-stream lose, repeat and reorder nothing a
client sees, and every job ends once."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from cli.launcher import wait_healthy
from tests.conftest import SYSTEM_START_TIMEOUT, WORKERS, System, run_system
from tests.gateway.keyed_gateway import KEY_A, KEY_B, bearer
from tests.helpers import (
    JOB_DEADLINE_SECONDS,
    LONG_PROMPT,
    TERMINAL,
    eventually,
    poll_all,
    read_sse,
    read_sse_through_outages,
    reconnected_mid_stream,
    record,
    streamed_text,
    submit,
    wait_for_status,
)
from tests.processes import Processes, free_port, wait_answering
from tests.redis_cluster import ClusteredRedis

JOBS = 8  # enough that, with a few more while a master has none yet, each master holds some
MOST_JOBS = 32
LONG_JOB_TOKENS = 2000  # a minute on the synthetic engine: such a job ends here only when cancelled
TENANTS = f"""
[[tenants]]
name = "bounded"
max_running_jobs = 1
[[tenants]]
name = "other"
[[keys]]
key = "{KEY_A}"
tenant = "bounded"
[[keys]]
key = "{KEY_B}"
tenant = "other"
"""
FAILOVER_TOKENS = 200  # six seconds a job on the synthetic engine: a failover's two or three fall inside


@dataclass(frozen=True)
class Gateways:
    """The system on the cluster, and the base URL of its second gateway (the first is `system`'s)."""

    system: System
    second_url: str


@pytest.fixture(scope="module")
def on_cluster(
    redis_url: str, redis_cluster: ClusteredRedis, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Gateways]:
    """Not named `system`: its tests would then count as needing the engine (tests/conftest.py's
    `pytest_collection_modifyitems`); they are `unit`, as the synthetic system's are."""
    started = run_system(
        redis_url,
        tmp_path_factory,
        engine="synthetic",
        synthetic_mean_tokens=0,
        streams_redis_url=redis_cluster.url,
    )
    system = next(started)
    processes = Processes(system.log_dir)
    try:
        settings = system.settings.model_copy(update={"port": free_port()})
        second = processes.start("gateway-second", "gateway", settings)
        second_url = f"http://127.0.0.1:{settings.port}"
        assert wait_healthy(second_url, [second], WORKERS, SYSTEM_START_TIMEOUT), f"logs in {system.log_dir}"
        yield Gateways(system, second_url)
    finally:
        processes.stop_all()
        started.close()


@pytest.fixture
async def clients(on_cluster: Gateways) -> AsyncIterator[tuple[httpx.AsyncClient, httpx.AsyncClient]]:
    """A client of each gateway."""
    async with (
        httpx.AsyncClient(base_url=on_cluster.system.base_url, timeout=JOB_DEADLINE_SECONDS) as first,
        httpx.AsyncClient(base_url=on_cluster.second_url, timeout=JOB_DEADLINE_SECONDS) as second,
    ):
        yield first, second


async def every_job_streaming(seen: dict[str, list[tuple[str, dict[str, Any]]]]) -> None:
    """Until each job's client has had its first delta."""

    async def all_running() -> bool:
        return all(any(event["type"] == "delta" for _, event in events) for events in seen.values())

    await eventually(all_running, "every job streams its first delta")


def assert_once_in_order_to_done(job_id: str, events: list[tuple[str, dict[str, Any]]]) -> None:
    """A client's events of a job: every seq once, in order, and one end, `done`."""
    assert seqs(events) == list(range(len(events))), job_id
    assert [event["type"] for _, event in events if event["type"] in TERMINAL] == ["done"], job_id


async def all_followed(
    following: dict[str, asyncio.Task[list[tuple[str, dict[str, Any]]]]],
    seen: dict[str, list[tuple[str, dict[str, Any]]]],
    client: httpx.AsyncClient,
) -> None:
    """Until every job's follower has its end; else fail naming each follow that stalled, how far it
    got, and where its job stands."""
    _, pending = await asyncio.wait(following.values(), timeout=JOB_DEADLINE_SECONDS)
    stalled = [job_id for job_id, task in following.items() if task in pending]
    for task in pending:
        task.cancel()
    for task in following.values():
        if task not in pending:
            task.result()  # a follow that failed fails the test with its own error
    states = {job_id: (await record(client, job_id))["status"] for job_id in stalled}
    assert not stalled, [(job_id, len(seen[job_id]), seen[job_id][-1:], states[job_id]) for job_id in stalled]


def seqs(events: list[tuple[str, dict[str, Any]]]) -> list[int]:
    return [event["seq"] for _, event in events]


async def test_jobs_on_every_master_stream_through_either_gateway_to_sse_and_long_poll_alike(
    clients: tuple[httpx.AsyncClient, httpx.AsyncClient], on_cluster: Gateways, redis_cluster: ClusteredRedis
) -> None:
    first, second = clients
    keys = on_cluster.system.keys
    jobs: list[str] = []
    while len(jobs) < JOBS or {redis_cluster.master_of(keys.stream(j)) for j in jobs} != set(
        redis_cluster.masters()
    ):
        assert len(jobs) < MOST_JOBS, "the partitions leave a master without jobs"
        jobs.append(await submit(first, prompt=LONG_PROMPT, max_tokens=30, stream_step=2))
    followed = await asyncio.gather(
        *(asyncio.gather(read_sse(first, job_id), poll_all(second, job_id, limit=3)) for job_id in jobs)
    )
    for job_id, (sse, polled) in zip(jobs, followed, strict=True):
        assert [stream_id for stream_id, _ in sse] == [event.pop("id") for event in polled]
        assert [event for _, event in sse] == polled
        assert [event["seq"] for event in polled] == list(range(len(polled)))
        assert polled[-1]["type"] == "done"
        job = await wait_for_status(second, job_id, {"completed"})
        assert job["output"]["text"] == streamed_text(polled) != ""


async def test_a_reader_resuming_through_the_other_gateway_misses_nothing_and_sees_nothing_twice(
    clients: tuple[httpx.AsyncClient, httpx.AsyncClient],
) -> None:
    first, second = clients
    job_id = await submit(first, prompt=LONG_PROMPT, max_tokens=40)
    whole = await reconnected_mid_stream(first, job_id, resume_through=second)
    assert whole[-1][1]["type"] == "done"


async def test_cancel_through_the_other_gateway_ends_a_running_job_cancelled(
    clients: tuple[httpx.AsyncClient, httpx.AsyncClient],
) -> None:
    first, second = clients
    job_id = await submit(first, prompt=LONG_PROMPT, max_tokens=LONG_JOB_TOKENS)
    began = await read_sse(first, job_id, stop_after=3)  # queued, running, a delta
    assert [event["type"] for _, event in began] == ["status", "status", "delta"]
    answer = await second.post(f"/v1/jobs/{job_id}/cancel")
    assert answer.status_code == 202 and answer.json()["status"] == "running", answer.text
    rest = await read_sse(first, job_id, last_event_id=began[-1][0])
    assert rest[-1][1]["type"] == "cancelled"
    events = [event for _, event in began + rest]
    assert [event["seq"] for event in events] == list(range(len(events)))
    job = await wait_for_status(second, job_id, {"cancelled"})
    assert job["output"]["text"] == streamed_text(events)


async def test_a_response_streams_through_one_gateway_and_resumes_through_the_other(
    clients: tuple[httpx.AsyncClient, httpx.AsyncClient], on_cluster: Gateways
) -> None:
    """The Responses API through the `openai` package: the whole text arrives, across gateways."""
    _, second = clients
    async with (
        openai.AsyncOpenAI(
            base_url=f"{on_cluster.system.base_url}/v1",
            api_key="none",
            max_retries=0,
            timeout=JOB_DEADLINE_SECONDS,
        ) as one,
        openai.AsyncOpenAI(
            base_url=f"{on_cluster.second_url}/v1",
            api_key="none",
            max_retries=0,
            timeout=JOB_DEADLINE_SECONDS,
        ) as other,
    ):
        stream = await one.responses.create(
            model=on_cluster.system.settings.model_name,
            input=LONG_PROMPT,
            background=True,
            stream=True,
            max_output_tokens=40,
        )
        began: list[Any] = []
        async for event in stream:
            began.append(event)
            if event.type == "response.output_text.delta" and len(began) >= 8:
                break
        await stream.close()  # the client drops; the response goes on
        response_id = began[0].response.id
        rest = [
            event
            async for event in await other.responses.retrieve(
                response_id, stream=True, starting_after=began[-1].sequence_number
            )
        ]
    events = began + rest
    assert [event.sequence_number for event in events] == list(range(len(events)))
    assert rest[-1].type == "response.incomplete"  # it ran to max_output_tokens
    text = "".join(event.delta for event in events if event.type == "response.output_text.delta")
    job = await record(second, response_id.removeprefix("resp_"))
    assert text == rest[-1].response.output_text == job["output"]["text"] != ""
    assert job["usage"]["completion_tokens"] == 40


async def test_tenants_keep_their_jobs_and_their_bounds_with_the_streams_on_the_cluster(
    on_cluster: Gateways, tmp_path: Path
) -> None:
    """A gateway of keyed tenants on the cluster's system: another tenant can neither follow nor cancel
    a tenant's job; a tenant at its bound on running jobs is refused until its job, cancelled
    mid-stream, ends; and its usage counts the exact tokens its jobs' records hold."""
    keys_file = tmp_path / "tenants.toml"
    keys_file.write_text(TENANTS)
    settings = on_cluster.system.settings.model_copy(
        update={"port": free_port(), "allow_unauthenticated": False, "api_keys_file": keys_file}
    )
    processes = Processes(tmp_path)
    base_url = f"http://127.0.0.1:{settings.port}"
    other = bearer(KEY_B)
    try:
        wait_answering(base_url, processes.start("gateway-tenants", "gateway", settings))
        async with httpx.AsyncClient(
            base_url=base_url, headers=bearer(KEY_A), timeout=JOB_DEADLINE_SECONDS
        ) as gateway:
            running = await submit(gateway, prompt=LONG_PROMPT, max_tokens=LONG_JOB_TOKENS)
            refused = await gateway.post("/v1/jobs", json={"prompt": LONG_PROMPT, "max_tokens": 8})
            assert refused.status_code == 429 and refused.json()["limit"] == "max_running_jobs", refused.text
            began = await read_sse(gateway, running, stop_after=3)  # queued, running, a delta
            assert (await gateway.get(f"/v1/jobs/{running}/events", headers=other)).status_code == 404
            assert (await gateway.post(f"/v1/jobs/{running}/cancel", headers=other)).status_code == 404
            assert (await gateway.post(f"/v1/jobs/{running}/cancel")).status_code == 202
            rest = await read_sse(gateway, running, last_event_id=began[-1][0])
            assert rest[-1][1]["type"] == "cancelled"
            cancelled = await wait_for_status(gateway, running, {"cancelled"})
            finished = await submit(gateway, prompt=LONG_PROMPT, max_tokens=12)
            events = await read_sse(gateway, finished)
            completed = await record(gateway, finished)
            usage = (await gateway.get("/v1/usage")).json()["usage"]
    finally:
        processes.stop_all()
    assert events[-1][1]["type"] == "done"
    assert completed["output"]["text"] == streamed_text([event for _, event in events]) != ""
    spent = sum(
        job["usage"]["prompt_tokens"] + job["usage"]["completion_tokens"] for job in (cancelled, completed)
    )
    assert usage["tokens_total"] == spent and usage["jobs_ended_total"] == 2
    assert usage["running_jobs"] == usage["queued_jobs"] == 0


async def test_a_slot_moved_under_load_loses_repeats_and_reorders_nothing_a_client_sees(
    clients: tuple[httpx.AsyncClient, httpx.AsyncClient], on_cluster: Gateways, redis_cluster: ClusteredRedis
) -> None:
    """Jobs stream to SSE clients while the slot of one job's partition moves to another master, its
    keys one at a time (MIGRATE: the steps meet ASK, TRYAGAIN, then MOVED, and are sent again; the
    readers are unsubscribed from its channel and subscribe where it is now): each client gets every
    event once, in order, and each job ends once, completed."""
    keys = on_cluster.system.keys
    jobs = [await submit(clients[n % 2], prompt=LONG_PROMPT, max_tokens=FAILOVER_TOKENS) for n in range(6)]
    seen: dict[str, list[tuple[str, dict[str, Any]]]] = {job_id: [] for job_id in jobs}
    following = {
        job_id: asyncio.create_task(read_sse_through_outages(clients[1 - n % 2], job_id, seen[job_id]))
        for n, job_id in enumerate(jobs)
    }

    await every_job_streaming(seen)
    moved = keys.stream(jobs[0])
    slot, source = redis_cluster.slot_of(moved), redis_cluster.master_of(moved)
    target = next(name for name in redis_cluster.masters() if name != source)
    await asyncio.to_thread(redis_cluster.move_slot, slot, target, batch=1, pause=0.05)
    await all_followed(following, seen, clients[0])
    for job_id, events in seen.items():
        assert_once_in_order_to_done(job_id, events)
        assert (await record(clients[0], job_id))["status"] == "completed", job_id
    assert redis_cluster.master_of(moved) == target


async def test_a_master_killed_mid_stream_loses_repeats_and_reorders_nothing_a_client_sees(
    clients: tuple[httpx.AsyncClient, httpx.AsyncClient], on_cluster: Gateways, redis_cluster: ClusteredRedis
) -> None:
    """Jobs stream to SSE clients of both gateways while a master dies and its replica takes over, and
    more are submitted meanwhile: each job answered 202 ends once, completed, and each client gets
    every event once, in order. Last in the module: the killed node comes back, as a replica."""
    keys = on_cluster.system.keys
    seen: dict[str, list[tuple[str, dict[str, Any]]]] = {}
    submitted_through: dict[str, int] = {}
    following: dict[str, asyncio.Task[list[tuple[str, dict[str, Any]]]]] = {}

    def follow(job_id: str, gateway: int) -> None:
        """The job submitted through `gateway`, followed through the other one, by a client that
        reconnects through the outage (`read_sse_through_outages`)."""
        seen[job_id], submitted_through[job_id] = [], gateway
        following[job_id] = asyncio.create_task(
            read_sse_through_outages(clients[1 - gateway], job_id, seen[job_id])
        )

    for n in range(9):
        follow(await submit(clients[n % 2], prompt=LONG_PROMPT, max_tokens=FAILOVER_TOKENS), n % 2)
    jobs = list(seen)
    victim = redis_cluster.master_of(keys.stream(jobs[0]))

    await every_job_streaming(seen)
    failover = asyncio.create_task(asyncio.to_thread(redis_cluster.kill_master, victim))
    try:
        attempts = 0
        while not failover.done():  # submissions meanwhile: each one answered 202, or refused (503)
            gateway, attempts = attempts % 2, attempts + 1
            body = {"prompt": LONG_PROMPT, "max_tokens": FAILOVER_TOKENS // 4}
            answer = await clients[gateway].post("/v1/jobs", json=body)
            assert answer.status_code in (202, 503), answer.text
            if answer.status_code == 202:
                follow(answer.json()["id"], gateway)
            await asyncio.sleep(0.2)
        promoted = await failover
        await all_followed(following, seen, clients[0])
        for job_id, events in seen.items():
            assert_once_in_order_to_done(job_id, events)
            job = await record(clients[submitted_through[job_id]], job_id)
            assert job["status"] == "completed", job_id
            assert job["output"]["text"] == streamed_text([event for _, event in events]), job_id
            again = await read_sse(clients[submitted_through[job_id]], job_id)
            assert again == events, job_id  # read again, as stored
        assert redis_cluster.master_of(keys.stream(jobs[0])) == promoted
    finally:
        await asyncio.wait([failover])  # the victim is dead before it starts again
        await asyncio.to_thread(redis_cluster.restart, victim)
