"""The gateway through a Redis outage: while Redis is down every request answers 503 saying so,
never 500, and /health says why; once Redis is back the same gateway answers again, the jobs
accepted before the outage (running and queued) all complete, and an event stream followed across
the outage carries on by itself (the stream reader reconnects and goes on from its cursor).

Redis is a private redis-server with its append-only file fsynced at every write
(`--appendfsync always`), so that even a SIGKILL loses nothing it acknowledged; the tests stop it
(SIGTERM, or SIGKILL) and start it again on the same port and folder. Its one worker takes one job
at a time, so that jobs wait in the queue across the outage. The subject is Redis, so the worker runs
the synthetic engine (paced as a GPU, greedy answers the same for the same prompt), which starts in a
second.
"""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Iterator
from dataclasses import dataclass
from subprocess import Popen
from typing import Any

import httpx
import pytest

from shared.config import Settings
from tests.conftest import make_settings
from tests.faults.conftest import (
    AOF,
    RECOVERY,
    WAIT_TIMEOUT,
    RedisServer,
    assert_one_seamless_stream,
    start_gateway_and_worker,
    wait_for_tokens,
)
from tests.helpers import LONG_PROMPT, eventually, read_sse, record, submit, wait_until
from tests.processes import Processes, free_port

FSYNC_ALWAYS = ("--appendfsync", "always")
SHORT = {"prompt": "The capital of France is", "max_tokens": 8, "temperature": 0}
HANDED_BACK = "handing the job back"  # the worker's log, once a running job's writes failed
READER_FAILED = "stream reader: Redis failed"
READER_BACK = "stream reader: Redis answers again"


@dataclass
class Deployment:
    """A gateway and a worker on a Redis of their own."""

    settings: Settings
    base_url: str
    processes: Processes
    gateway: Popen[bytes]
    redis: RedisServer

    def log(self, name: str) -> str:
        return (self.processes.log_dir / f"{name}.log").read_text(errors="replace")


@pytest.fixture(scope="module")
def deployment(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Deployment]:
    processes = Processes(tmp_path_factory.mktemp("redis-outage"))
    redis = RedisServer(processes, free_port(), processes.log_dir / "redis-data", (*AOF, *FSYNC_ALWAYS))
    settings = make_settings(
        redis.start(),
        port=free_port(),
        host="127.0.0.1",
        allow_unauthenticated=True,
        metrics_port=free_port(),
        worker_max_jobs=1,
        sse_ping_seconds=1.0,  # idle streams check their job during the outage too
        engine="synthetic",
        synthetic_mean_tokens=0,  # an answer runs to its max_tokens
        **RECOVERY,
    )
    try:
        gateway, base_url = start_gateway_and_worker(processes, settings)
        yield Deployment(settings, base_url, processes, gateway, redis)
    finally:
        processes.stop_all()


async def test_while_redis_is_down_every_route_answers_503_saying_so_and_200_once_it_is_back(
    deployment: Deployment, gateway: httpx.AsyncClient
) -> None:
    before = await submit(gateway, **SHORT)
    await wait_until(gateway, before, lambda job: job["status"] == "completed", "a job before the outage")
    await asyncio.to_thread(deployment.redis.stop)

    stream = {"Accept": "text/event-stream"}
    native = {
        "submit": await gateway.post("/v1/jobs", json=SHORT),
        "record": await gateway.get(f"/v1/jobs/{before}"),
        "events": await gateway.get(f"/v1/jobs/{before}/events", headers=stream),
        "cancel": await gateway.post(f"/v1/jobs/{before}/cancel"),
    }

    async def health_unavailable() -> httpx.Response | None:
        answer = await gateway.get("/health")
        return answer if answer.status_code == 503 else None

    # /health answers from what the gateway read of the workers at most a second ago.
    native["health"] = await eventually(health_unavailable, "/health says Redis is down", 5)
    for route, answer in native.items():
        assert answer.status_code == 503, f"{route}: {answer.text}"
        assert answer.headers["Retry-After"] == "1"
        body = answer.json()
        assert body["error_type"] == "unavailable"
        assert body["error"].startswith("Redis is unreachable"), body
    assert native["health"].json()["redis"] == "unreachable"
    openai = {"model": deployment.settings.model_name, "prompt": SHORT["prompt"], "max_tokens": 8}
    for answer in [
        await gateway.post("/v1/completions", json=openai),
        await gateway.post("/v1/completions", json=openai | {"stream": True}),
    ]:
        assert answer.status_code == 503, answer.text
        error = answer.json()["error"]
        assert error["code"] == "unavailable"
        assert error["message"].startswith("Redis is unreachable"), error

    await asyncio.to_thread(deployment.redis.start)
    # The first request after Redis is back is answered: the gateway's connections are made anew.
    again = await gateway.get(f"/v1/jobs/{before}")
    assert again.status_code == 200, again.text
    assert again.json()["status"] == "completed"
    after = await submit(gateway, **SHORT)
    job = await wait_until(gateway, after, lambda job: job["status"] == "completed", "a job after the outage")
    assert job["output"]["text"] == (await record(gateway, before))["output"]["text"]

    async def healthy() -> bool:
        return (await gateway.get("/health")).status_code == 200  # once the worker's heartbeat is back

    await eventually(healthy, "/health answers 200 again", WAIT_TIMEOUT)
    assert deployment.gateway.poll() is None
    assert "Traceback" not in deployment.log("gateway")


@pytest.mark.parametrize("stop", [signal.SIGTERM, signal.SIGKILL], ids=["sigterm", "sigkill"])
async def test_jobs_from_before_a_redis_restart_all_complete_and_a_stream_followed_across_it_goes_on(
    deployment: Deployment, gateway: httpx.AsyncClient, stop: signal.Signals
) -> None:
    running = await submit(gateway, prompt=LONG_PROMPT, max_tokens=160, temperature=0)
    following = asyncio.create_task(read_sse(gateway, running))
    await wait_for_tokens(gateway, running, 5)
    queued = [await submit(gateway, **SHORT) for _ in range(2)]
    assert [(await record(gateway, job_id))["status"] for job_id in queued] == ["queued", "queued"]
    handed_back = deployment.log("worker").count(HANDED_BACK)
    reader_failed = deployment.log("gateway").count(READER_FAILED)

    async def outage_seen() -> bool:
        return deployment.log("worker").count(HANDED_BACK) > handed_back

    await asyncio.to_thread(deployment.redis.stop, stop)
    await eventually(outage_seen, "the worker notices the outage", WAIT_TIMEOUT)
    # Down long enough for the stalled stream's keep-alives to ask Redis whether its job ended.
    await asyncio.sleep(3 * deployment.settings.sse_ping_seconds)
    await asyncio.to_thread(deployment.redis.start)

    # One connection from the first event to `done`: the stream went on by itself.
    events = [event for _, event in await asyncio.wait_for(following, WAIT_TIMEOUT)]
    assert_one_seamless_stream(events)
    assert events[-1]["type"] == "done"
    resumed = [event["attempt"] for event in events if event["type"] == "status" and event["resumed"]]
    assert resumed == [2]
    job = await record(gateway, running)
    assert (job["status"], job["attempts"]) == ("completed", 2)
    gateway_log = deployment.log("gateway")
    assert gateway_log.count(READER_FAILED) == reader_failed + 1
    assert gateway_log.count(READER_BACK) == reader_failed + 1

    for job_id in queued:
        job = await wait_until(gateway, job_id, terminal, "a job queued before the outage ends")
        assert (job["status"], job["attempts"]) == ("completed", 1)
        events = [event for _, event in await read_sse(gateway, job_id)]
        assert_one_seamless_stream(events)
        assert events[-1]["type"] == "done"


def terminal(job: dict[str, Any]) -> bool:
    return job["status"] not in ("queued", "running")
