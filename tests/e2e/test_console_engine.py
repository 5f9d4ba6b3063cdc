"""The console's view of workers on the real engine: vLLM's KV-cache use and the tokens generated reach
it through the workers' heartbeats."""

from __future__ import annotations

import time

import httpx

from tests.conftest import System

TIMEOUT_SECONDS = 120  # the job may wait behind other tests' jobs on the session's engines


def test_the_snapshot_shows_each_workers_kv_cache_use_and_counts_its_tokens(system: System) -> None:
    url = f"{system.base_url}/v1/console/snapshot"
    before = {worker["worker_id"]: worker["generated_tokens"] for worker in httpx.get(url).json()["workers"]}
    answer = httpx.post(
        f"{system.base_url}/v1/jobs", json={"prompt": "The sky is", "max_tokens": 8, "ignore_eos": True}
    )
    assert answer.status_code == 202, answer.text
    job_id = answer.json()["id"]
    deadline = time.monotonic() + TIMEOUT_SECONDS
    while (record := httpx.get(f"{system.base_url}/v1/jobs/{job_id}").json())["status"] != "completed":
        assert time.monotonic() < deadline and record["status"] in ("queued", "running"), record
        time.sleep(0.2)
    worker = record["worker"]
    while True:  # until a heartbeat after the job's end has reached a snapshot
        workers = {found["worker_id"]: found for found in httpx.get(url).json()["workers"]}
        if workers[worker]["generated_tokens"] >= before.get(worker, 0) + 8 or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert workers[worker]["generated_tokens"] >= before.get(worker, 0) + 8
    assert len(workers) == len(system.workers)
    for found in workers.values():
        assert found["kv_cache_usage"] is not None and 0 <= found["kv_cache_usage"] <= 1, found
        assert found["max_jobs"] == system.settings.worker_max_jobs
