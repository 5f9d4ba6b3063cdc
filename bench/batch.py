"""`python -m bench.batch [--quick]`: a batch in the gaps interactive work leaves.

On one gateway and one worker on the synthetic engine (a GPU's fixed step period, so that the figures
are the queue's and the slots', not this machine's CPU), in one run:

1. interactive time to first token (streamed chat, one request at a time) on the idle worker;
2. the batch's jobs submitted directly (`POST /v1/jobs`, all at once): jobs per second until the last ends;
3. the same jobs as a batch of a JSONL file (`/v1/files`, `/v1/batches`): jobs per second from its
   creation until it is `completed`, and meanwhile, on the worker the batch keeps saturated, interactive
   time to first token again.

Targets (docs/../DESIGN): interactive TTFT p50 at most 1.5x idle; batch throughput at least 0.95 of
direct submission. Also run as the last phase of `bench.run`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import httpx

from bench import system
from bench.stats import percentile
from tests.redis_cleanup import delete_prefix

MODEL = "smol"
PROMPT = [{"role": "user", "content": "Say something."}]
CONCURRENCY = 64  # direct submissions (and reads) under way at once
ENDS = ("completed", "failed", "cancelled")


@dataclass(frozen=True)
class BatchPlan:
    lines: int
    max_tokens: int  # of each batch job
    interactive: int  # TTFT samples each side
    step_seconds: float
    max_jobs: int


FULL = BatchPlan(2000, 32, 100, 0.03, 256)
QUICK = BatchPlan(2000, 16, 40, 0.03, 256)


@dataclass(frozen=True)
class BatchFigures:
    idle_ttft_ms: list[float]
    busy_ttft_ms: list[float]
    direct_jobs_per_s: float
    batch_jobs_per_s: float
    plan: BatchPlan
    reserved_share: float

    def lines(self) -> list[str]:
        idle50, idle99 = percentile(self.idle_ttft_ms, 50), percentile(self.idle_ttft_ms, 99)
        busy50, busy99 = percentile(self.busy_ttft_ms, 50), percentile(self.busy_ttft_ms, 99)
        ratio = self.batch_jobs_per_s / self.direct_jobs_per_s
        return [
            f"| interactive TTFT, idle worker | p50 {idle50:.1f} ms, p99 {idle99:.1f} ms |",
            f"| interactive TTFT, worker saturated by the batch | p50 {busy50:.1f} ms, p99 {busy99:.1f} ms "
            f"({busy50 / idle50:.2f}x idle at p50; target <= 1.5x) |",
            f"| {self.plan.lines} jobs submitted directly | {self.direct_jobs_per_s:.1f} jobs/s |",
            f"| the same jobs as one batch | {self.batch_jobs_per_s:.1f} jobs/s ({ratio:.2f} of direct; "
            f"target >= 0.95) |",
        ]


async def first_token_ms(http: httpx.AsyncClient) -> float:
    """One streamed chat request's time to its first content chunk."""
    body = {"model": MODEL, "messages": PROMPT, "max_tokens": 4, "stream": True}
    began = time.perf_counter()
    took: float | None = None
    async with http.stream("POST", "/v1/chat/completions", json=body) as answer:
        async for line in answer.aiter_lines():  # read to the end: the job ends before the next request
            if took is None and line.startswith("data: {") and '"content":"' in line.replace(" ", ""):
                took = (time.perf_counter() - began) * 1000
    if took is not None:
        return took
    raise RuntimeError("no token came")


async def ttfts(http: httpx.AsyncClient, count: int) -> list[float]:
    return [await first_token_ms(http) for _ in range(count)]


async def direct(http: httpx.AsyncClient, plan: BatchPlan) -> float:
    """Jobs per second of `plan.lines` jobs submitted at once (`CONCURRENCY` requests at a time), until
    the last ends."""
    body = {"model": MODEL, "messages": PROMPT, "max_tokens": plan.max_tokens}
    began = time.perf_counter()
    ids: list[str] = []
    for start in range(0, plan.lines, CONCURRENCY):
        count = min(CONCURRENCY, plan.lines - start)
        answers = await asyncio.gather(*(http.post("/v1/jobs", json=body) for _ in range(count)))
        ids += [answer.json()["id"] for answer in answers]

    async def ended(job_id: str) -> None:
        while (await http.get(f"/v1/jobs/{job_id}")).json()["status"] not in ENDS:
            await asyncio.sleep(0.2)

    for start in range(0, len(ids), CONCURRENCY):
        await asyncio.gather(*(ended(job_id) for job_id in ids[start : start + CONCURRENCY]))
    return plan.lines / (time.perf_counter() - began)


async def batch(http: httpx.AsyncClient, plan: BatchPlan) -> tuple[float, list[float]]:
    """Jobs per second of the same jobs as one batch, and interactive TTFTs taken while it runs."""
    lines = [
        {
            "custom_id": f"r{n}",
            "method": "POST",
            "url": "/v1/chat/completions",
            "body": {"model": MODEL, "messages": PROMPT, "max_tokens": plan.max_tokens},
        }
        for n in range(plan.lines)
    ]
    data = "".join(json.dumps(line) + "\n" for line in lines).encode()
    uploaded = (
        await http.post("/v1/files", files={"file": ("in.jsonl", data)}, data={"purpose": "batch"})
    ).json()
    began = time.perf_counter()
    created = await http.post(
        "/v1/batches",
        json={
            "input_file_id": uploaded["id"],
            "endpoint": "/v1/chat/completions",
            "completion_window": "24h",
        },
    )
    batch_id = created.json()["id"]

    async def running() -> dict[str, object]:
        return dict((await http.get(f"/v1/batches/{batch_id}")).json())

    while (await running())["request_counts"]["completed"] < plan.max_jobs:  # type: ignore[index]
        await asyncio.sleep(0.05)  # until the worker is saturated by the batch
    busy = await ttfts(http, plan.interactive)
    while (state := await running())["status"] not in ("completed", "failed", "expired", "cancelled"):
        await asyncio.sleep(0.05)
    if state["status"] != "completed":
        raise RuntimeError(f"the batch ended {state['status']}")
    return plan.lines / (time.perf_counter() - began), busy


async def measure_on(base_url: str, plan: BatchPlan, reserved_share: float) -> BatchFigures:
    async with httpx.AsyncClient(base_url=base_url, timeout=600) as http:
        idle = await ttfts(http, plan.interactive)
        direct_rate = await direct(http, plan)
        batch_rate, busy = await batch(http, plan)
    return BatchFigures(idle, busy, direct_rate, batch_rate, plan, reserved_share)


def measure(redis_url: str, plan: BatchPlan, logs: Path, reserved_share: float = 0.25) -> BatchFigures:
    """A gateway and a synthetic worker of their own on `redis_url`, measured, then stopped."""
    settings = system.bench_settings(
        redis_url,
        engine="synthetic",
        served_model_name=MODEL,
        default_model=MODEL,
        synthetic_step_seconds=plan.step_seconds,
        synthetic_mean_tokens=0,
        worker_max_jobs=plan.max_jobs,
        worker_poll_delay=0.01,
        batch_reserved_share=reserved_share,
        files_dir=logs / "files",
    )
    children = [system.start_gateway(settings, logs), system.start_worker(settings, logs)]
    try:
        system.wait_ready(settings, children, workers=1)
        return asyncio.run(measure_on(system.base_url(settings), plan, reserved_share))
    finally:
        for child in children:
            child.stop()
        delete_prefix(redis_url, settings.key_prefix)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="fewer samples, shorter jobs")
    parser.add_argument(
        "--reserved-share", type=float, default=0.25, help="the workers' batch_reserved_share"
    )
    args = parser.parse_args()
    logs = Path(tempfile.mkdtemp(prefix="streampool-bench-batch-"))
    server, url = system.start_redis(logs)
    try:
        figures = measure(url, QUICK if args.quick else FULL, logs, args.reserved_share)
    finally:
        server.terminate()
        server.wait()
    print(f"batch_reserved_share {figures.reserved_share}, {figures.plan}")
    print("\n".join(figures.lines()))


if __name__ == "__main__":
    main()
