"""LoRA adapters loaded at run time through vLLM's routes reach every worker of the pool, those that start
later included; jobs for one queue while no worker is live; an unload lets running jobs finish.

On the synthetic engine: the subject is how a load travels through Redis to workers that come and go
(the synthetic engine checks an adapter's folder as vLLM does, and draws other tokens with one); that
the real engine writes with the weights loaded is tests/e2e/test_models.py's.
"""

from __future__ import annotations

import asyncio
import json
import signal
from pathlib import Path
from typing import Any

import httpx
import pytest

from shared.workers import WorkerInfo
from tests.conftest import DEFAULT_MODEL_DIR
from tests.faults.conftest import WAIT_TIMEOUT, Pool, wait_for_tokens
from tests.helpers import eventually, eventually_sync, record, submit, wait_for_status

MODEL = DEFAULT_MODEL_DIR.name
PROMPT = {"prompt": "The sea", "max_tokens": 8, "temperature": 0}


@pytest.fixture(scope="module")
def pool(synthetic_pool: Pool) -> Pool:
    return synthetic_pool


def adapter_folder(tmp_path: Path, name: str) -> Path:
    """A folder that holds an adapter as far as the synthetic engine looks (vLLM reads its weights too)."""
    folder = tmp_path / name
    folder.mkdir()
    (folder / "adapter_config.json").write_text(json.dumps({"peft_type": "LORA", "r": 8}))
    return folder


async def load(client: httpx.AsyncClient, name: str, path: Path | str, **more: Any) -> httpx.Response:
    return await client.post(
        "/v1/load_lora_adapter", json={"lora_name": name, "lora_path": str(path), **more}
    )


async def unload(client: httpx.AsyncClient, name: str) -> httpx.Response:
    return await client.post("/v1/unload_lora_adapter", json={"lora_name": name})


def holding(pool: Pool, name: str) -> set[int]:
    """The pids of the workers whose heartbeat says they hold the adapter `name`."""
    return {
        info.pid
        for info in pool.heartbeats()
        if (held := info.runtime_adapters.get(name)) is not None and held.error is None
    }


async def listed(client: httpx.AsyncClient) -> dict[str, dict[str, Any]]:
    answer = await client.get("/v1/models")
    assert answer.status_code == 200, answer.text
    return {model["id"]: model for model in answer.json()["data"]}


async def test_a_loaded_adapter_reaches_every_worker_and_one_that_starts_later(
    pool: Pool, client: httpx.AsyncClient, tmp_path: Path
) -> None:
    pool.ensure_workers()
    folder = adapter_folder(tmp_path, "sea")
    answer = await load(client, "sea", folder)
    assert (answer.status_code, answer.text) == (200, "Success: LoRA adapter 'sea' added successfully.")
    try:
        live = {process.pid for process in pool.live_workers().values()}
        await eventually(
            lambda: asyncio.to_thread(holding, pool, "sea"), "both workers hold it", until=live.__le__
        )
        models = await listed(client)
        assert {key: models["sea"][key] for key in ("id", "root", "parent")} == {
            "id": "sea",
            "root": str(folder),
            "parent": MODEL,
        }

        adapted = await wait_for_status(client, await submit(client, **PROMPT, model="sea"), {"completed"})
        base = await wait_for_status(client, await submit(client, **PROMPT, model=MODEL), {"completed"})
        assert adapted["adapter"] == "sea"
        assert adapted["output"]["text"] != base["output"]["text"]

        # A worker that starts after the load loads it before its first heartbeat.
        killed = next(iter(pool.live_workers()))
        pool.processes.signal(killed, signal.SIGKILL)
        await asyncio.to_thread(pool.workers[killed].wait, WAIT_TIMEOUT)
        await asyncio.to_thread(pool.ensure_workers)
        newest = pool.workers[max(pool.workers, key=lambda name: int(name.split("-")[1]))]
        assert newest.pid in await asyncio.to_thread(holding, pool, "sea")
        again = await wait_for_status(client, await submit(client, **PROMPT, model="sea"), {"completed"})
        assert again["output"]["text"] == adapted["output"]["text"]
    finally:
        await unload(client, "sea")


async def test_a_load_or_unload_that_cannot_be_is_refused_as_vllm_refuses_it_and_leaves_nothing(
    pool: Pool, client: httpx.AsyncClient, tmp_path: Path
) -> None:
    pool.ensure_workers()
    missing = tmp_path / "nowhere"
    answer = await load(client, "ghost", missing)
    assert answer.status_code == 404, answer.text
    assert answer.json()["error"]["message"] == f"Loading lora ghost failed: No adapter found for {missing}"
    assert "ghost" not in await listed(client)
    refused = await client.post("/v1/completions", json={**PROMPT, "model": "ghost"})
    assert refused.status_code == 404, refused.text

    folder = adapter_folder(tmp_path, "reef")
    assert (await load(client, "reef", folder)).status_code == 200
    try:
        again = await load(client, "reef", folder)
        assert again.status_code == 400
        assert again.json()["error"]["message"].startswith("The lora adapter 'reef' has already been loaded.")
        assert (await load(client, "reef", folder, load_inplace=True)).status_code == 200
    finally:
        assert (await unload(client, "reef")).text == "Success: LoRA adapter 'reef' removed successfully."

    base = await load(client, MODEL, folder)
    assert base.status_code == 400
    assert (
        base.json()["error"]["message"] == f"The lora adapter '{MODEL}' conflicts with a served base model."
    )
    assert (await load(client, "a:b", folder)).status_code == 400
    assert (await load(client, "reef", folder, model="no-such-model")).status_code == 404
    assert (await client.post("/v1/load_lora_adapter", json={"lora_name": "reef"})).status_code == 400
    gone = await unload(client, "reef")
    assert gone.status_code == 404
    assert gone.json()["error"]["message"] == "The lora adapter 'reef' cannot be found."


async def test_an_unload_refuses_new_jobs_of_the_adapter_and_lets_running_ones_finish(
    pool: Pool, client: httpx.AsyncClient, tmp_path: Path
) -> None:
    pool.ensure_workers()
    assert (await load(client, "tide", adapter_folder(tmp_path, "tide"))).status_code == 200
    job_id = await submit(client, prompt="The tide", max_tokens=150, temperature=0, model="tide")
    await wait_for_tokens(client, job_id, 3)

    assert (await unload(client, "tide")).status_code == 200
    refused = await client.post("/v1/completions", json={**PROMPT, "model": "tide"})
    assert refused.status_code == 404, refused.text
    assert "tide" not in await listed(client)
    job = await wait_for_status(client, job_id, {"completed", "failed", "cancelled"})
    assert (job["status"], job["output"]["token_count"]) == ("completed", 150)

    def forgotten() -> bool:
        return not any("tide" in info.runtime_adapters for info in pool.heartbeats())

    await asyncio.to_thread(eventually_sync, forgotten, "the workers let the adapter go")


async def test_jobs_for_an_adapter_queue_while_no_worker_is_live_and_run_once_one_starts(
    pool: Pool, client: httpx.AsyncClient, tmp_path: Path
) -> None:
    pool.ensure_workers()
    for name in list(pool.live_workers()):
        pool.processes.signal(name, signal.SIGTERM)
        await asyncio.to_thread(pool.workers[name].wait, WAIT_TIMEOUT)
    await eventually(lambda: asyncio.to_thread(pool.heartbeats), "no heartbeat left", until=_none_live)

    answer = await load(client, "kelp", adapter_folder(tmp_path, "kelp"))
    try:
        assert answer.status_code == 503, answer.text
        assert "it stays loaded" in answer.json()["error"]["message"]
        job_id = await submit(client, **PROMPT, model="kelp")
        assert (await record(client, job_id))["status"] == "queued"

        await asyncio.to_thread(pool.ensure_workers)
        job = await wait_for_status(client, job_id, {"completed", "failed"})
        assert (job["status"], job["adapter"]) == ("completed", "kelp")
    finally:
        await unload(client, "kelp")


def _none_live(heartbeats: list[WorkerInfo]) -> bool:
    return not heartbeats
