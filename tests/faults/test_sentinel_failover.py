"""A Redis failover under load: a master, its replica and three Sentinels (`redis-server` processes of
the test's own, on loopback), a gateway and a worker (on the synthetic engine: the subject is Redis)
that know only the Sentinels. The master is
SIGKILLed while jobs stream and wait in the queue, and while submissions pour in; or cut off from the
Sentinels alone (a partition), so that its replica is promoted while it still answers: every job that got
a 202 completes exactly once, every stream followed across the failover is one stream without gap or
duplicate, and meanwhile the gateway answers nothing but what it answers when healthy or 503 with
Retry-After, never a 500.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from subprocess import Popen

import httpx
import pytest

from shared.config import Settings
from tests.conftest import make_settings
from tests.faults.conftest import (
    RECOVERY,
    WAIT_TIMEOUT,
    assert_one_seamless_stream,
    start_gateway_and_worker,
    wait_for_tokens,
)
from tests.helpers import LONG_PROMPT, read_sse, submit, wait_until
from tests.processes import Processes, free_port
from tests.replicated_redis import ReplicatedRedis

SHORT = {"prompt": "The capital of France is", "max_tokens": 4, "temperature": 0}
RUNNING = {"prompt": LONG_PROMPT, "max_tokens": 240, "ignore_eos": True, "temperature": 0}
PROBE_SECONDS = 0.05
# Longer than a failover takes here (about 2 s): a running job's steps are sent again until the new
# master takes them, rather than the job being handed back.
LEASE_SECONDS = 10.0
ALONE_SECONDS = 0.3  # the master writes steps its replica never receives, then dies
SUBMITTERS = 4
PARTITION_SECONDS = 2.0  # the old master answers its clients this long after its replica's promotion


@dataclass
class Deployment:
    settings: Settings
    base_url: str
    processes: Processes
    redis: ReplicatedRedis
    gateway: Popen[bytes]

    def log(self, name: str) -> str:
        return (self.processes.log_dir / f"{name}.log").read_text(errors="replace")


@pytest.fixture(scope="module")
def deployment(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Deployment]:
    processes = Processes(tmp_path_factory.mktemp("sentinel-failover"))
    try:
        redis = ReplicatedRedis.start(processes, sentinels=3)
        settings = make_settings(
            redis.sentinel_url,
            port=free_port(),
            host="127.0.0.1",
            allow_unauthenticated=True,
            metrics_port=free_port(),
            worker_max_jobs=2,  # so that jobs wait in the queue across the failover
            engine="synthetic",  # the subject is Redis: a worker that starts in a second
            synthetic_mean_tokens=0,  # an answer runs to its max_tokens
            sse_ping_seconds=1.0,
            **RECOVERY | {"lease_seconds": LEASE_SECONDS},
        )
        gateway, base_url = start_gateway_and_worker(processes, settings)
        yield Deployment(settings, base_url, processes, redis, gateway)
    finally:
        processes.stop_all()


@dataclass
class Answers:
    """What the gateway answered while the test pressed on it: statuses, and the jobs it accepted."""

    statuses: Counter[int] = field(default_factory=Counter)
    accepted: list[str] = field(default_factory=list)
    without_retry_after: list[str] = field(default_factory=list)
    last_refusal: str = ""
    unanswered: httpx.HTTPError | None = None

    def note(self, answer: httpx.Response) -> None:
        self.statuses[answer.status_code] += 1
        if answer.status_code == 202:
            self.accepted.append(answer.json()["id"])
        if answer.status_code == 503:
            self.last_refusal = answer.text
            if "Retry-After" not in answer.headers:
                self.without_retry_after.append(answer.text)

    def assert_only_success_or_503(self) -> None:
        assert set(self.statuses) <= {200, 202, 503}, self.statuses
        assert self.statuses[503] > 0, f"no request met the failover: {self.statuses}"
        assert not self.without_retry_after


async def press(gateway: httpx.AsyncClient, answers: Answers, stop: asyncio.Event, job_id: str) -> None:
    """Submit a job and read a record, again and again, until `stop`. A request that gets no answer at
    all ends the pressing, and `accepting_again` with it."""
    try:
        while not stop.is_set():
            answers.note(await gateway.post("/v1/jobs", json=SHORT))
            answers.note(await gateway.get(f"/v1/jobs/{job_id}"))
            await asyncio.sleep(PROBE_SECONDS)
    except httpx.HTTPError as error:
        answers.unanswered = error
        raise


async def fail_over(
    deployment: Deployment, answers: Answers, stop: asyncio.Event, alone_seconds: float = 0.0
) -> None:
    """SIGKILL the master, after `alone_seconds` of writes its replica does not receive; once the
    Sentinels have promoted its replica, the dead master is back as the new one's replica (as an
    orchestrator restarts it: until then the new master has no replica to hold a write, so it
    acknowledges none) and the gateway takes jobs again, stop pressing."""
    master = current_master(deployment)
    if alone_seconds:
        await asyncio.to_thread(deployment.redis.kill_after_writing_alone, master, alone_seconds)
    else:
        await asyncio.to_thread(deployment.redis.kill, master)
    await asyncio.to_thread(deployment.redis.wait_failover_from, master)
    await asyncio.to_thread(deployment.redis.restore_replica, master)
    await accepting_again(deployment, answers, stop)


async def partition(deployment: Deployment, answers: Answers, stop: asyncio.Event) -> None:
    """Cut the master off from the Sentinels alone: they promote its replica while it goes on
    answering the gateway and the worker on the connections they hold, for `PARTITION_SECONDS`. Then
    it rejoins as the new master's replica (dropping what it took meanwhile), and once the gateway
    takes jobs again, stop pressing."""
    master = current_master(deployment)
    await asyncio.to_thread(deployment.redis.cut_off_from_sentinels, master)
    await asyncio.to_thread(deployment.redis.wait_failover_from, master)
    await asyncio.sleep(PARTITION_SECONDS)
    await asyncio.to_thread(deployment.redis.rejoin, master)
    await accepting_again(deployment, answers, stop)


def current_master(deployment: Deployment) -> str:
    return "master" if deployment.redis.master_port() == deployment.redis.ports["master"] else "replica"


async def accepting_again(deployment: Deployment, answers: Answers, stop: asyncio.Event) -> None:
    """Once `SUBMITTERS` more jobs are accepted, stop pressing; if that never comes, say what the
    gateway answered instead and what it logged."""
    accepted = len(answers.accepted)

    async def more() -> None:
        while len(answers.accepted) < accepted + SUBMITTERS:
            assert answers.unanswered is None, f"a request got no answer: {answers.unanswered!r}"
            await asyncio.sleep(PROBE_SECONDS)

    try:
        await asyncio.wait_for(more(), WAIT_TIMEOUT)
    except TimeoutError:
        log = deployment.log("gateway")[-4000:]
        pytest.fail(f"not accepting again: {answers.statuses}, last 503: {answers.last_refusal}\n{log}")
    finally:
        stop.set()


async def assert_completed_once(gateway: httpx.AsyncClient, job_id: str) -> None:
    """Completed, with one stream from `queued` to one `done`: no gap, no duplicate."""
    job = await wait_until(gateway, job_id, lambda job: job["status"] not in ("queued", "running"), job_id)
    assert job["status"] == "completed", job
    events = [event for _, event in await read_sse(gateway, job_id)]
    assert_one_seamless_stream(events)
    assert events[-1]["type"] == "done"


async def test_jobs_running_and_queued_through_a_failover_complete_once_and_followed_streams_go_on(
    deployment: Deployment, gateway: httpx.AsyncClient
) -> None:
    # Long enough to be running still once both have streamed a few tokens and the master dies, on a
    # slow machine too: the engine's first steps after its start can take seconds.
    running = [await submit(gateway, **RUNNING) for _ in range(2)]
    following = [asyncio.create_task(read_sse(gateway, job_id)) for job_id in running]
    await asyncio.gather(*(wait_for_tokens(gateway, job_id, 5) for job_id in running))
    queued = [await submit(gateway, **SHORT) for _ in range(2)]

    answers, stop = Answers(), asyncio.Event()
    pressing = asyncio.create_task(press(gateway, answers, stop, running[0]))
    await fail_over(deployment, answers, stop, ALONE_SECONDS)
    await pressing
    answers.assert_only_success_or_503()

    # One connection each, from the first event to `done`: the streams went on by themselves, and
    # went on seamless though the new master lacked steps the followers had read from the old one.
    for followed in following:
        events = [event for _, event in await asyncio.wait_for(followed, WAIT_TIMEOUT)]
        assert_one_seamless_stream(events)
        assert events[-1]["type"] == "done"
    for job_id in [*running, *queued, *answers.accepted]:
        await assert_completed_once(gateway, job_id)
    assert "a failover lost events" in deployment.log("worker")  # ... and its worker wrote them again
    assert deployment.gateway.poll() is None
    assert "Traceback" not in deployment.log("gateway")


async def test_a_submission_burst_through_a_failover_completes_every_job_it_acknowledged(
    deployment: Deployment, gateway: httpx.AsyncClient
) -> None:
    await burst_through(deployment, gateway, fail_over)


async def test_a_submission_burst_through_a_partition_completes_every_job_it_acknowledged(
    deployment: Deployment, gateway: httpx.AsyncClient
) -> None:
    """What the old master took while cut off is gone once it rejoins: none of it was acknowledged."""
    await burst_through(deployment, gateway, partition)


async def burst_through(
    deployment: Deployment,
    gateway: httpx.AsyncClient,
    failure: Callable[[Deployment, Answers, asyncio.Event], Awaitable[None]],
) -> None:
    """Submitters press on the gateway through `failure`: every job it acknowledged completes once."""
    probe = await submit(gateway, **SHORT)

    answers, stop = Answers(), asyncio.Event()
    submitters = [asyncio.create_task(press(gateway, answers, stop, probe)) for _ in range(SUBMITTERS)]
    while len(answers.accepted) < 2 * SUBMITTERS:  # the burst is under way
        await asyncio.sleep(PROBE_SECONDS)
    await failure(deployment, answers, stop)
    await asyncio.gather(*submitters)
    answers.assert_only_success_or_503()

    completed = 0
    for job_id in answers.accepted:
        await assert_completed_once(gateway, job_id)
        completed += 1
    assert completed == len(answers.accepted) == answers.statuses[202]
    assert "Traceback" not in deployment.log("gateway")
