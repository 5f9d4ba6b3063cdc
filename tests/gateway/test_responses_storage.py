"""What a response costs Redis, on a real gateway process and a private redis-server: a conversation
is stored once (each turn writes its own input, however long the conversation), one submission's
write is bounded before anything is written, admission by memory counts the write it is about to
make, and a deletion waits for its replicas as a submission does.

No engine runs: a stand-in worker starts each turn's job and ends it through the job store, as a
worker does, and reads back the whole conversation the worker renders its prompt from.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
import redis.asyncio as aioredis

from gateway.compat.responses_bodies import ResponsesBody
from shared.config import DEFAULT_MODEL_DIR
from shared.events import DoneEvent, JobState, Usage
from shared.jobstore import JobStore, Outcome
from shared.keys import ANONYMOUS_OWNER
from shared.requests import JobRequest
from tests.gateway.keyed_gateway import KeyedGateway, run_gateway
from tests.gateway.stand_ins import private_redis

MODEL = DEFAULT_MODEL_DIR.name  # the gateway's default model: known with no worker
WORKER = "stand-in-worker"
TURNS = 6
TURN_CHARS = 100_000
MAXMEMORY = 8 * 2**20
FILLER = "x" * 32 * 2**10


@dataclass
class Served:
    gateway: KeyedGateway
    redis: aioredis.Redis
    store: JobStore
    http: httpx.AsyncClient

    async def finish(self, job_id: str, text: str) -> JobRequest:
        """Run the job as a worker does: start it, read the request it generates from, end it with `text`."""
        started = await self.store.start(job_id, WORKER, MODEL, lease_seconds=60)
        assert started is not None
        whole = await self.store.whole_request(started)
        usage = Usage(prompt_tokens=1, completion_tokens=1)
        done = DoneEvent(seq=2, finish_reason="stop", usage=usage)
        outcome = Outcome(JobState.completed, text, 1, usage, finish_reason="stop")
        await self.redis.execute_command(*self.store.finish_commands(job_id, WORKER, [done], outcome).record)
        return whole

    async def record_bytes(self, response_id: str) -> int:
        """What the response's job record holds in Redis, every field counted."""
        key = self.gateway.keys.job(response_id.removeprefix("resp_"))
        size: int = await self.redis.memory_usage(key, samples=0)
        return size

    async def key_count(self) -> int:
        return len([key async for key in self.redis.scan_iter(f"{self.gateway.settings.key_prefix}:*")])


@contextmanager
def _gateway(redis_url: str, folder: Path, **overrides: object) -> Iterator[KeyedGateway]:
    folder.mkdir()
    yield from run_gateway(redis_url, folder, allow_unauthenticated=True, **overrides)


async def _deploy(url: str, folder: Path, **overrides: object) -> AsyncIterator[Served]:
    client = aioredis.Redis.from_url(url, decode_responses=True)
    try:
        with _gateway(url, folder / "gateway", **overrides) as gateway:
            async with httpx.AsyncClient(base_url=gateway.base_url, timeout=30) as http:
                yield Served(gateway, client, JobStore(client, gateway.keys, gateway.settings), http)
    finally:
        await client.aclose()


@pytest.fixture
async def served(tmp_path: Path) -> AsyncIterator[Served]:
    with private_redis(tmp_path / "redis") as url:
        async for deployed in _deploy(url, tmp_path):
            yield deployed


def _turn(n: int) -> str:
    return f"turn {n}: " + "w" * TURN_CHARS


async def test_a_conversation_is_stored_once_each_turn_writing_its_own_input(served: Served) -> None:
    previous: str | None = None
    sizes, renders = [], []
    for n in range(TURNS):
        body = {"model": MODEL, "input": _turn(n), "background": True, "previous_response_id": previous}
        created = await served.http.post("/v1/responses", json=body)
        assert created.status_code == 200, created.text
        previous = created.json()["id"]
        renders.append(await served.finish(previous.removeprefix("resp_"), f"answer {n}"))
        sizes.append(await served.record_bytes(previous))

    # Turn k holds its own input, not the k turns before it: about the same bytes each turn.
    assert max(sizes) < 1.2 * min(sizes), sizes
    assert max(sizes) < 1.5 * TURN_CHARS, sizes
    # The worker still generates from the whole conversation, read back turn by turn.
    last = renders[-1].messages or []
    expected = [part for n in range(TURNS - 1) for part in (_turn(n), f"answer {n}")] + [_turn(TURNS - 1)]
    assert [message.content for message in last] == expected
    assert [message.role for message in last] == ["user", "assistant"] * (TURNS - 1) + ["user"]
    items = (await served.http.get(f"/v1/responses/{previous}/input_items")).json()["data"]
    assert [item["content"][0]["text"] for item in items] == [_turn(TURNS - 1)]

    # A conversation whose first turn is gone cannot go on: a 404 naming that turn, nothing made.
    chain = [previous]
    while earlier := (await served.http.get(f"/v1/responses/{chain[-1]}")).json()["previous_response_id"]:
        chain.append(earlier)
    assert (await served.http.delete(f"/v1/responses/{chain[-1]}")).status_code == 200
    keys_before = await served.key_count()
    refused = await served.http.post(
        "/v1/responses", json={"model": MODEL, "input": "more", "previous_response_id": previous}
    )
    assert refused.status_code == 404, refused.text
    assert refused.json()["error"]["param"] == "previous_response_id"
    assert chain[-1] in refused.json()["error"]["message"]
    assert await served.key_count() == keys_before


async def test_a_submission_past_the_write_bound_is_refused_before_anything_is_written(
    tmp_path: Path,
) -> None:
    with private_redis(tmp_path / "redis") as url:
        async for served in _deploy(url, tmp_path, max_request_write_bytes=64 * 1024):
            keys_before = await served.key_count()
            large = "w" * 100_000
            responses = await served.http.post("/v1/responses", json={"model": MODEL, "input": large})
            native = await served.http.post("/v1/jobs", json={"model": MODEL, "prompt": large})
            assert await served.key_count() == keys_before
            small = await served.http.post("/v1/jobs", json={"model": MODEL, "prompt": "w" * 1000})
    assert responses.status_code == native.status_code == 413, responses.text
    assert "max_request_write_bytes" in responses.json()["error"]["message"]
    assert "max_request_write_bytes" in native.json()["error"]
    assert small.status_code == 202, small.text


async def test_admission_by_memory_counts_the_bytes_the_submission_is_about_to_write(tmp_path: Path) -> None:
    options = ("--maxmemory", str(MAXMEMORY), "--maxmemory-policy", "noeviction")
    with private_redis(tmp_path / "redis", *options) as url:
        async for served in _deploy(url, tmp_path):
            n = 0
            while await _share_used(served.redis) < 0.8:
                await served.redis.set(f"another-app:{n}", FILLER)
                n += 1
            time.sleep(1.1)  # the gateway reads Redis's memory at most once a second
            assert await _share_used(served.redis) < 0.85  # below the mark (0.9): room for small jobs
            large = await served.http.post("/v1/jobs", json={"model": MODEL, "prompt": "w" * 900_000})
            small = await served.http.post("/v1/jobs", json={"model": MODEL, "prompt": "w" * 1000})
            share = await _share_used(served.redis)
    # Written, the large one would take Redis past the mark: refused before it writes.
    assert large.status_code == 429, large.text
    assert "maxmemory" in large.json()["error"]
    assert small.status_code == 202, small.text
    assert share < 0.9


async def _share_used(client: aioredis.Redis) -> float:
    memory = await client.info("memory")
    return int(memory["used_memory"]) / int(memory["maxmemory"])


async def test_a_deletion_is_acknowledged_only_once_its_replicas_hold_it(tmp_path: Path) -> None:
    with private_redis(tmp_path / "redis") as url:
        async for served in _deploy(url, tmp_path, min_replicas_to_ack=1, replica_ack_timeout_ms=100):
            # Made and ended through a store that asks no replica: the gateway answers a submission
            # with 503, this Redis having none.
            settings = served.gateway.settings.model_copy(update={"min_replicas_to_ack": None})
            store = JobStore(served.redis, served.gateway.keys, settings)
            body = ResponsesBody.model_validate({"model": MODEL, "input": "hi", "background": True})
            job = body.job_request(2048)
            annotations = body.stored(job).annotations()
            submitted = await store.submit(
                job, model=MODEL, owner=ANONYMOUS_OWNER, max_queued=0, annotations=annotations
            )
            await served.finish(submitted.job_id, "hello")
            deleted = await served.http.delete(f"/v1/responses/resp_{submitted.job_id}")
            submit = await served.http.post("/v1/responses", json={"model": MODEL, "input": "hi"})
    assert deleted.status_code == submit.status_code == 503, deleted.text
    assert "replicas" in deleted.json()["error"]["message"]
