"""Several models behind one gateway, on real processes: each worker takes only its own model's
jobs (by its name, an alias or an adapter), a declared model with no worker queues its jobs until a
worker of it starts, and tenants share one model's queue fairly; a LoRA adapter changes what its base
model writes, also batched with it.

The queue's tests run workers of the synthetic engine (their subject is where a job goes, not what
it generates) under two served names of the default model, the first announcing an adapter, which the
synthetic engine never loads. The adapter's test runs on the session's workers of the real engine
that serve a real adapter (`pool`; random weights, `tests/lora_adapter.py`), run by vLLM's CPU build,
beside the session's workers of the same weights without one; so does the test of an adapter
loaded at run time (tests/faults/test_runtime_adapters.py follows such loads through workers that come
and go, on the synthetic engine).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis.asyncio as aioredis

from cli.launcher import wait_healthy
from shared.config import DEFAULT_MODEL_DIR, Settings
from shared.keys import Keys
from tests.conftest import SYSTEM_START_TIMEOUT, System, make_settings
from tests.faults.conftest import Pool
from tests.gateway.keyed_gateway import KEY_A, KEY_B, bearer
from tests.helpers import eventually, in_process_gateway, submit, wait_for_status
from tests.lora_adapter import ADAPTER, make_adapter
from tests.processes import Processes, free_port
from tests.redis_cleanup import delete_prefix

FIRST = "smol-a"
SECOND = "smol-b"
SECOND_ALIAS = "smol-b-alias"
LATE = "smol-late"  # declared by the gateway; its worker starts only in the test that needs it
PROMPT = {"prompt": "The capital of France is", "max_tokens": 8, "temperature": 0}
STARTED = {"completed"}
SECOND_SLOTS = 4  # jobs SECOND's worker runs at once: few, so that a backlog waits in its queue


@dataclass
class ModelsPool:
    settings: Settings
    base_url: str
    processes: Processes
    workers: dict[str, int]  # served name -> the pid of its worker process

    def start_worker(self, name: str, **settings: Any) -> int:
        update = {"metrics_port": free_port(), "served_model_name": name, "engine": "synthetic", **settings}
        process = self.processes.start(f"worker-{name}", "worker", self.settings.model_copy(update=update))
        self.workers[name.split(",")[0]] = process.pid
        return process.pid

    def model_of(self, worker_id: str) -> str:
        """The model of the worker a record's `worker` (host-pid-stamp) names."""
        pid = int(worker_id.rsplit("-", 2)[1])
        return next(model for model, worker_pid in self.workers.items() if worker_pid == pid)


@pytest.fixture(scope="module")
def models_pool(redis_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ModelsPool]:
    """A gateway declaring LATE, a synthetic worker of FIRST (announcing the adapter) and one of SECOND
    (with an alias)."""
    settings = make_settings(
        redis_url,
        port=free_port(),
        host="127.0.0.1",
        allow_unauthenticated=True,
        default_model=None,
        models=[LATE],
    )
    processes = Processes(tmp_path_factory.mktemp("models-logs"))
    gateway = processes.start("gateway", "gateway", settings)
    pool = ModelsPool(settings, f"http://127.0.0.1:{settings.port}", processes, {})
    pool.start_worker(FIRST, lora=[f"{ADAPTER}={tmp_path_factory.mktemp('unread-adapter')}"])
    pool.start_worker(f"{SECOND},{SECOND_ALIAS}", worker_max_jobs=SECOND_SLOTS)
    try:
        children = list(processes.children.values())
        assert wait_healthy(pool.base_url, children, 2, SYSTEM_START_TIMEOUT), processes.log_dir
        assert gateway.poll() is None
        yield pool
    finally:
        processes.stop_all()
        delete_prefix(redis_url, settings.key_prefix)


@pytest.fixture
async def client(models_pool: ModelsPool) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=models_pool.base_url, timeout=120) as http:
        yield http


async def test_each_worker_runs_only_its_own_models_jobs(
    client: httpx.AsyncClient, models_pool: ModelsPool
) -> None:
    names = [FIRST, SECOND, SECOND_ALIAS, f"{FIRST}:{ADAPTER}", ADAPTER] * 3
    job_ids = [await submit(client, **PROMPT, model=name) for name in names]
    records = [await wait_for_status(client, job_id, STARTED) for job_id in job_ids]
    expected = {  # the model that runs it, and its adapter
        FIRST: (FIRST, None),
        SECOND: (SECOND, None),
        SECOND_ALIAS: (SECOND, None),
        f"{FIRST}:{ADAPTER}": (FIRST, ADAPTER),
        ADAPTER: (FIRST, ADAPTER),
    }
    ran_on = [
        (name, models_pool.model_of(record["worker"]), record["model"], record["adapter"])
        for name, record in zip(names, records, strict=True)
    ]
    assert ran_on == [(name, expected[name][0], *expected[name]) for name in names]


async def test_a_declared_model_without_a_worker_queues_until_one_starts(
    client: httpx.AsyncClient, models_pool: ModelsPool
) -> None:
    job_id = await submit(client, **PROMPT, model=LATE)
    # A client that waits for its answer waits too, rather than being refused.
    waiting_answer = asyncio.ensure_future(
        client.post("/v1/completions", json={**PROMPT, "model": LATE}, timeout=SYSTEM_START_TIMEOUT + 60)
    )
    record = await wait_for_status(client, job_id, {"queued"})
    assert record["waiting"] == f"waiting for a worker of model {LATE}: none is live"
    events = (await client.get(f"/v1/jobs/{job_id}/events")).json()["events"]
    assert events[0]["message"] == record["waiting"]
    listed = {model["id"]: model for model in (await client.get("/v1/models")).json()["data"]}

    async def queued_two() -> int:
        depth: int = (await client.get(f"/v1/models/{LATE}")).json()["queue_depth"]
        return depth

    await eventually(queued_two, "both jobs queued", 10, until=lambda depth: depth == 2)
    assert listed[LATE]["workers"] == 0 and not waiting_answer.done()

    models_pool.start_worker(LATE)
    record = await wait_for_status(client, job_id, STARTED, timeout=SYSTEM_START_TIMEOUT)
    answer = await waiting_answer
    assert models_pool.model_of(record["worker"]) == LATE and record["waiting"] is None
    assert answer.status_code == 200 and answer.json()["choices"][0]["text"] == record["output"]["text"]


BACKLOG = 300
BULK_TOKENS = 32  # steps of the synthetic engine's 0.03 s
FAIR_TENANTS = f"""
[[tenants]]
name = "bulk"
[[tenants]]
name = "interactive"
[[keys]]
key = "{KEY_A}"
tenant = "bulk"
[[keys]]
key = "{KEY_B}"
tenant = "interactive"
"""


async def test_a_tenants_backlog_delays_another_tenants_next_job_by_at_most_a_pickup(
    models_pool: ModelsPool, redis_client: aioredis.Redis, tmp_path: Path
) -> None:
    """Tenant `bulk` queues 300 jobs of SECOND, then `interactive` one: of `bulk`'s jobs, only those
    SECOND's worker had already claimed may start between the submission of `interactive`'s job and
    its start (counted from the records' times, not timed)."""
    keys_file = tmp_path / "tenants.toml"
    keys_file.write_text(FAIR_TENANTS)
    settings = models_pool.settings.model_copy(
        update={"allow_unauthenticated": False, "api_keys_file": keys_file}
    )
    keys = Keys.of(settings)
    job = {"prompt": "Hello", "max_tokens": 1, "model": SECOND}
    # A second a job at 4 at once: the worker drains none of the backlog while the rest is submitted,
    # however slowly a loaded machine submits it (at one token a job it drained most of it by then).
    bulk_job = {**job, "max_tokens": BULK_TOKENS}
    async with in_process_gateway(settings) as gateway:
        answers = await asyncio.gather(
            *(gateway.post("/v1/jobs", json=bulk_job, headers=bearer(KEY_A)) for _ in range(BACKLOG))
        )
        assert [answer.status_code for answer in answers] == [202] * BACKLOG
        bulk = [answer.json()["id"] for answer in answers]
        gateway.headers.update(bearer(KEY_B))
        interactive = await submit(gateway, **job)
        await wait_for_status(gateway, interactive, {"completed"})
        gateway.headers.update(bearer(KEY_A))
        await asyncio.gather(*(gateway.post(f"/v1/jobs/{job_id}/cancel") for job_id in bulk))

    async with redis_client.pipeline(transaction=False) as pipe:
        for job_id in [interactive, *bulk]:
            pipe.hmget(keys.job(job_id), ["created_at", "started_at"])
        (submitted_at, started_at), *bulk_times = await pipe.execute()
    overtaking = [
        started
        for _, started in bulk_times
        if started and float(submitted_at) < float(started) < float(started_at)
    ]
    waiting_then = sum(1 for _, started in bulk_times if not started or float(started) > float(submitted_at))
    assert waiting_then > 10 * SECOND_SLOTS  # a backlog was there to be overtaken
    assert len(overtaking) <= SECOND_SLOTS, (len(overtaking), waiting_then)


async def test_an_adapter_changes_what_its_base_model_writes_also_when_batched_with_it(
    pool: Pool, system: System
) -> None:
    """Base and adapter jobs at once on the workers serving the adapter, greedy: each kind gives one
    text, the base model's that of the session's workers (the same weights, no adapter), the adapter's
    another."""
    model = DEFAULT_MODEL_DIR.name
    names = [model, f"{model}:{ADAPTER}", ADAPTER] * 3
    async with httpx.AsyncClient(base_url=pool.base_url, timeout=120) as http:
        job_ids = [await submit(http, **PROMPT, model=name) for name in names]
        records = [await wait_for_status(http, job_id, STARTED) for job_id in job_ids]
    async with httpx.AsyncClient(base_url=system.base_url, timeout=120) as http:
        plain = await wait_for_status(http, await submit(http, **PROMPT, model=model), STARTED)

    assert [(record["model"], record["adapter"]) for record in records] == [
        (model, None),
        (model, ADAPTER),
        (model, ADAPTER),
    ] * 3
    texts: dict[str | None, set[str]] = {}
    for record in records:
        texts.setdefault(record["adapter"], set()).add(record["output"]["text"])
    assert all(len(outputs) == 1 for outputs in texts.values()), texts
    assert texts[None] == {plain["output"]["text"]}
    assert texts[ADAPTER] != texts[None]


async def test_an_adapter_loaded_at_run_time_writes_as_the_same_weights_given_at_start(
    pool: Pool, tmp_path: Path
) -> None:
    """vLLM's `/v1/load_lora_adapter` on the real engine: the weights of `ADAPTER` loaded under another
    name write what `ADAPTER` writes, not what the base model writes; a path without an adapter is
    vLLM's 404; an unload lets a running job of the adapter finish and refuses the next."""
    model = DEFAULT_MODEL_DIR.name
    folder = make_adapter(tmp_path / "parrot")  # the seed and scale of the pool's own adapter
    async with httpx.AsyncClient(base_url=pool.base_url, timeout=120) as http:
        loaded = await http.post(
            "/v1/load_lora_adapter", json={"lora_name": "parrot", "lora_path": str(folder)}
        )
        assert (loaded.status_code, loaded.text) == (
            200,
            "Success: LoRA adapter 'parrot' added successfully.",
        )
        listing = {entry["id"]: entry for entry in (await http.get("/v1/models")).json()["data"]}
        assert (listing["parrot"]["root"], listing["parrot"]["parent"]) == (str(folder), model)

        names = ["parrot", ADAPTER, model]
        records = [
            await wait_for_status(http, await submit(http, **PROMPT, model=name), {"completed"})
            for name in names
        ]
        parrot, pirate, base = (record["output"]["text"] for record in records)
        assert parrot == pirate != base

        missing = await http.post(
            "/v1/load_lora_adapter", json={"lora_name": "ghost", "lora_path": str(tmp_path / "nowhere")}
        )
        assert missing.status_code == 404, missing.text
        assert "No adapter found" in missing.json()["error"]["message"]

        running = await submit(http, prompt="Once upon a time", max_tokens=48, temperature=0, model="parrot")
        await wait_for_status(http, running, {"running", "completed"})
        assert (await http.post("/v1/unload_lora_adapter", json={"lora_name": "parrot"})).status_code == 200
        refused = await http.post("/v1/completions", json={**PROMPT, "model": "parrot"})
        assert refused.status_code == 404, refused.text
        finished = await wait_for_status(http, running, {"completed", "failed"})
        assert (finished["status"], finished["output"]["token_count"]) == ("completed", 48)
