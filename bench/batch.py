"""`python -m bench.batch [--quick]`: a batch in the gaps interactive work leaves.

On one gateway and one worker on the synthetic engine (a GPU's fixed step period, so that the figures
are the queue's and the slots', not this machine's CPU), in one run:

1. interactive time to first token (streamed chat, one request at a time) on the idle worker;
2. the batch's jobs submitted directly (`POST /v1/jobs`, all at once): jobs per second until the last ends;
3. the same jobs as a batch of a JSONL file (`/v1/files`, `/v1/batches`): jobs per second from the
   file's upload until the batch is `completed`, and meanwhile, on the worker the batch keeps
   saturated, interactive time to first token again;
4. with `--memory-lines N` (50,000 in a full run), a batch of N one-token lines: the gateway's resident
   memory as its lines are fed and done, which must stay flat (the driver reads the file as it feeds it, and a
   batch holds `batch_in_flight` jobs at most).

Targets (docs/../DESIGN): interactive TTFT p50 at most 1.5x idle; batch throughput at least 0.95 of
direct submission. Also run as the last phase of `bench.run`.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from bench import system
from bench.stats import percentile
from bench.system import Child
from shared.config import Settings
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
    memory_lines: int = 0  # the one-token batch whose feeding the gateway's memory is followed through


FULL = BatchPlan(5000, 32, 100, 0.03, 256, memory_lines=50_000)  # the batch outlasts 100 samples
QUICK = BatchPlan(2000, 16, 40, 0.03, 256)
MEMORY_SAMPLE_SECONDS = 0.5
RESERVED_SHARE: float = Settings.model_fields["batch_reserved_share"].default


@dataclass(frozen=True)
class MemoryProfile:
    """The gateway's resident set while a batch of `lines` one-token lines runs: (lines done, MiB)."""

    lines: int
    before_mib: float  # before the file's upload
    samples: list[tuple[int, float]]
    seconds: float

    def at_done(self, share: float) -> float:
        """The resident set at the first sample with `share` of the lines done."""
        return next(mib for done, mib in self.samples if done >= share * self.lines)

    def line(self) -> str:
        tenth, half, done = self.at_done(0.1), self.at_done(0.5), self.at_done(1.0)
        peak = max(mib for _, mib in self.samples)
        return (
            f"| gateway memory through a batch of {self.lines:,} one-token lines ({self.seconds:.0f} s) | "
            f"{self.before_mib:.0f} MiB before the upload; {tenth:.0f} / {half:.0f} / {done:.0f} MiB at "
            f"10 / 50 / 100 % done, peak {peak:.0f} ({peak - tenth:+.0f} MiB past 10 % done) |"
        )


@dataclass(frozen=True)
class BatchFigures:
    idle_ttft_ms: list[float]
    busy_ttft_ms: list[float]
    direct_jobs_per_s: float
    batch_jobs_per_s: float
    plan: BatchPlan
    reserved_share: float
    memory: MemoryProfile | None = None

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
            *([self.memory.line()] if self.memory else []),
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


async def start_batch(http: httpx.AsyncClient, lines: int, max_tokens: int) -> str:
    """Upload a JSONL of `lines` chat requests and create its batch; the batch's id."""
    body = {"model": MODEL, "messages": PROMPT, "max_tokens": max_tokens}
    data = "".join(
        json.dumps({"custom_id": f"r{n}", "method": "POST", "url": "/v1/chat/completions", "body": body})
        + "\n"
        for n in range(lines)
    ).encode()
    uploaded = (
        await http.post("/v1/files", files={"file": ("in.jsonl", data)}, data={"purpose": "batch"})
    ).json()
    created = await http.post(
        "/v1/batches",
        json={
            "input_file_id": uploaded["id"],
            "endpoint": "/v1/chat/completions",
            "completion_window": "24h",
        },
    )
    return str(created.json()["id"])


async def batch_state(http: httpx.AsyncClient, batch_id: str) -> dict[str, Any]:
    return dict((await http.get(f"/v1/batches/{batch_id}")).json())


async def until_ended(http: httpx.AsyncClient, batch_id: str) -> None:
    """Until the batch ends; `RuntimeError` unless it ends completed."""
    while (state := await batch_state(http, batch_id))["status"] not in (*ENDS, "expired"):
        await asyncio.sleep(0.05)
    if state["status"] != "completed":
        raise RuntimeError(f"the batch ended {state['status']}")


async def batch(http: httpx.AsyncClient, plan: BatchPlan) -> tuple[float, list[float]]:
    """Jobs per second of the same jobs as one batch (its upload included), and interactive TTFTs taken
    while it runs."""
    began = time.perf_counter()
    batch_id = await start_batch(http, plan.lines, plan.max_tokens)
    while (await batch_state(http, batch_id))["request_counts"]["completed"] < plan.max_jobs:
        await asyncio.sleep(0.05)  # until the worker is saturated by the batch
    busy = await ttfts(http, plan.interactive)
    if (await batch_state(http, batch_id))["status"] != "in_progress":
        raise RuntimeError("the batch ended before the interactive samples did: give it more lines")
    await until_ended(http, batch_id)
    return plan.lines / (time.perf_counter() - began), busy


async def memory_profile(http: httpx.AsyncClient, gateway: Child, lines: int) -> MemoryProfile:
    """The gateway's resident set, sampled every `MEMORY_SAMPLE_SECONDS` through a batch of `lines`
    one-token lines, against how many of them are done (fed lines are at most `batch_in_flight` more)."""

    def resident_mib() -> float:
        return float(gateway.handle.memory_info().rss) / 2**20

    before = resident_mib()
    began = time.perf_counter()
    batch_id = await start_batch(http, lines, 1)
    samples: list[tuple[int, float]] = []
    while True:
        state = await batch_state(http, batch_id)
        samples.append((_done(state), resident_mib()))
        if state["status"] in (*ENDS, "expired"):
            break
        await asyncio.sleep(MEMORY_SAMPLE_SECONDS)
    if state["status"] != "completed":
        raise RuntimeError(f"the batch ended {state['status']}")
    return MemoryProfile(lines, before, samples, time.perf_counter() - began)


def _done(state: dict[str, Any]) -> int:
    """The lines whose jobs ended, as the batch object counts them; all, once it is past feeding."""
    counts = state["request_counts"]
    if state["status"] in ("finalizing", "completed"):
        return int(counts["total"])
    return int(counts["completed"]) + int(counts["failed"])


async def measure_on(base_url: str, plan: BatchPlan, reserved_share: float, gateway: Child) -> BatchFigures:
    async with httpx.AsyncClient(base_url=base_url, timeout=600) as http:
        idle = await ttfts(http, plan.interactive)
        direct_rate = await direct(http, plan)
        batch_rate, busy = await batch(http, plan)
        memory = await memory_profile(http, gateway, plan.memory_lines) if plan.memory_lines else None
    return BatchFigures(idle, busy, direct_rate, batch_rate, plan, reserved_share, memory)


def measure(
    redis_url: str, plan: BatchPlan, logs: Path, reserved_share: float = RESERVED_SHARE
) -> BatchFigures:
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
    gateway = system.start_gateway(settings, logs)
    children = [gateway, system.start_worker(settings, logs)]
    try:
        system.wait_ready(settings, children, workers=1)
        return asyncio.run(measure_on(system.base_url(settings), plan, reserved_share, gateway))
    finally:
        for child in children:
            child.stop()
        delete_prefix(redis_url, settings.key_prefix)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="fewer samples, shorter jobs")
    parser.add_argument(
        "--reserved-share", type=float, default=RESERVED_SHARE, help="the workers' batch_reserved_share"
    )
    parser.add_argument(
        "--memory-lines",
        type=int,
        default=None,
        help="lines of the batch the gateway's memory is followed through (0: none; default 50,000, "
        "none with --quick)",
    )
    args = parser.parse_args()
    plan = QUICK if args.quick else FULL
    if args.memory_lines is not None:
        plan = dataclasses.replace(plan, memory_lines=args.memory_lines)
    logs = Path(tempfile.mkdtemp(prefix="streampool-bench-batch-"))
    server, url = system.start_redis(logs)
    try:
        figures = measure(url, plan, logs, args.reserved_share)
    finally:
        server.terminate()
        server.wait()
    print(f"batch_reserved_share {figures.reserved_share}, {figures.plan}")
    print("\n".join(figures.lines()))


if __name__ == "__main__":
    main()
