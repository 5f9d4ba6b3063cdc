"""Scheduling: what prefix-aware claiming gains on the real engine, what it costs the claim script, and
fair shares counted in tokens (docs/scheduling.md).

- Conversations (real engine): 2 workers, 16 conversations of 6 turns each over a shared system
  prompt of about 1,000 tokens, each turn sent as the last answer ends (streamed chat through the
  gateway, temperature 0): vLLM's prefix-cache hit rate (its own counters, summed over the workers)
  and time to the first content token, p50 and p99, with prefix-aware claiming and without it; and
  the same conversations on one vLLM server alone.
- Claim cost (Redis alone): 2,000 jobs of 50 prefix groups queued, 8 workers (heartbeats and
  advertised blocks: each group held by one), claimed one job a call in turn by the 8, timed by
  Redis itself (INFO commandstats, EVALSHA), with affinity and without it on a copy of the same
  queue; every job claimed once.
- Token shares (synthetic worker): two tenants of equal weight, one of long jobs (800 prompt tokens,
  200 output), one of short ones (20, 5), both kept backlogged for 60 s on one worker of 4 slots:
  the weighted tokens each was served, with the share counted in tokens and counted in jobs.

`python -m bench.scheduling [--quick] [--parts conversations,claims,shares]` runs this phase alone
on a private redis-server, puts its figures into bench/results.json (`scheduling`) and renders
RESULTS.md again; `make bench` runs it after the other phases, once no engine is alive.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shlex
import sys
import tempfile
import time
from collections.abc import Callable, Coroutine
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import httpx
import redis.asyncio as aioredis

from bench import report, system, vllm_server
from bench.scheduling_figures import (
    FULL,
    QUICK,
    ClaimCost,
    Conversations,
    Scheduling,
    SchedulingPlan,
    TokenShares,
)
from bench.scheduling_report import NO_AFFINITY, ONE_SERVER, PREFIX_AWARE
from bench.stats import percentile
from shared.config import Settings
from shared.events import JobState
from shared.jobstore import JobStore
from shared.keys import Keys, share_member
from shared.lifecycle.claims import Affinity, advertise, claim
from shared.requests import JobRequest
from shared.scheduling import Placement, block_hashes
from shared.tenants import DEFAULT_TENANT, Tenant
from worker.claiming import AFFINITY_WINDOW

SYSTEM_PROMPT = (
    "You are the harbour master's assistant. You answer sailors' questions about tides, currents, "
    "moorings, weather and the rules of the port, briefly and precisely, in plain words. "
) * 30  # about 1,000 tokens
QUESTIONS = [
    "When is the next high tide, and how high will it be?",
    "Where can a 12-metre boat moor overnight?",
    "What should I do if the wind rises above force 6?",
    "Which channel do I call the harbour on?",
    "How fast is the current at the harbour mouth on the ebb?",
    "Is fuel available on Sunday?",
]
HITS, QUERIES = "vllm:prefix_cache_hits_total", "vllm:prefix_cache_queries_total"
SYNTHETIC_BLOCK = 16
PARTS = ["claims", "shares", "conversations"]


# Conversations on the real engine.


async def first_content_ms(client: httpx.AsyncClient, body: dict[str, object]) -> tuple[float, str]:
    """A streamed chat's time to its first content token (ms) and its whole answer."""
    began, first, parts = time.perf_counter(), None, []
    async with client.stream("POST", "/v1/chat/completions", json={**body, "stream": True}) as answer:
        answer.raise_for_status()
        async for line in answer.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            choices = json.loads(line[6:]).get("choices") or [{}]
            content = choices[0].get("delta", {}).get("content")
            if content:
                first = first if first is not None else time.perf_counter()
                parts.append(content)
    return ((first or time.perf_counter()) - began) * 1000, "".join(parts)


async def talk(
    client: httpx.AsyncClient, model: str, number: int, plan: SchedulingPlan, ttfts: list[float]
) -> None:
    messages = [{"role": "system", "content": SYSTEM_PROMPT}]
    for turn in range(plan.turns):
        messages.append({"role": "user", "content": f"Sailor {number}: {QUESTIONS[turn % len(QUESTIONS)]}"})
        body = {"model": model, "messages": messages, "max_tokens": plan.answer_tokens, "temperature": 0}
        ttft, answer = await first_content_ms(client, body)
        ttfts.append(ttft)
        messages.append({"role": "assistant", "content": answer})


async def cache_counters(metrics_urls: list[str]) -> tuple[float, float]:
    """vLLM's prefix-cache hits and queries (tokens), summed over the engines' metrics pages."""
    hits = queries = 0.0
    async with httpx.AsyncClient(timeout=30) as client:
        for url in metrics_urls:
            for line in (await client.get(url)).text.splitlines():
                name = line.split("{")[0].split(" ")[0]
                if name in (HITS, QUERIES):
                    value = float(line.rsplit(" ", 1)[1])
                    hits, queries = (hits + value, queries) if name == HITS else (hits, queries + value)
    return hits, queries


async def conversations(
    label: str, base_url: str, model: str, metrics_urls: list[str], plan: SchedulingPlan
) -> Conversations:
    hits_before, queries_before = await cache_counters(metrics_urls)
    ttfts: list[float] = []
    began = time.monotonic()
    async with httpx.AsyncClient(base_url=base_url, timeout=600) as client:
        await asyncio.gather(
            *(talk(client, model, number, plan, ttfts) for number in range(plan.conversations))
        )
    seconds = time.monotonic() - began
    await asyncio.sleep(1)  # vLLM records a step's stats just after its outputs
    hits, queries = await cache_counters(metrics_urls)
    rate = (hits - hits_before) / max(1.0, queries - queries_before)
    return Conversations(label, len(ttfts), percentile(ttfts, 50), percentile(ttfts, 99), rate, seconds)


def streampool_conversations(url: str, logs: Path, plan: SchedulingPlan, affinity: bool) -> Conversations:
    settings = system.bench_settings(url, prefix_aware_claiming=affinity, log_level="INFO")
    second = settings.model_copy(update={"metrics_port": system.free_port()})
    children: list[system.Child] = []
    try:
        children.append(system.start_gateway(settings, logs / ("affinity" if affinity else "no-affinity")))
        children += [
            system.start_worker(one, logs / f"worker-{n}-{affinity}")
            for n, one in enumerate((settings, second))
        ]
        system.wait_ready(settings, children, workers=2)
        urls = [system.worker_metrics_url(one) for one in (settings, second)]
        label = PREFIX_AWARE if affinity else NO_AFFINITY
        return asyncio.run(conversations(label, system.base_url(settings), settings.model_name, urls, plan))
    finally:
        system.tear_down(children, url, settings.key_prefix, None)


def vllm_conversations(url: str, logs: Path, plan: SchedulingPlan) -> Conversations:
    settings = system.bench_settings(url)
    port = system.free_port()
    server = vllm_server.start_server(settings, port, logs, "vllm-server")
    try:
        vllm_server.wait_ready(port, server)
        base = f"http://127.0.0.1:{port}"
        model = httpx.get(f"{base}/v1/models").json()["data"][0]["id"]
        return asyncio.run(conversations(ONE_SERVER, base, model, [f"{base}/metrics"], plan))
    finally:
        vllm_server.stop(server)


# The claim script's cost, on Redis alone.


async def leave_queue(store: JobStore, model_name: str, job_id: str) -> None:
    """What a worker's start does to a claimed job's queue entries (`leave_queue.lua`)."""
    model = store.keys.model(model_name)
    created_at = float(await store.redis.hget(store.keys.job(job_id), "created_at"))  # type: ignore[misc]
    await store.redis.zrem(model.queue, job_id)
    await store.redis.zrem(model.share_queue_prefix + DEFAULT_TENANT, share_member(created_at, job_id))


async def evalsha(redis: aioredis.Redis) -> tuple[int, int]:
    stats = (await redis.info("commandstats")).get("cmdstat_evalsha", {"calls": 0, "usec": 0})
    return int(stats["calls"]), int(stats["usec"])


async def claim_cost(store: JobStore, plan: SchedulingPlan) -> ClaimCost:
    keys, workers = store.keys, [f"bench-worker-{n}" for n in range(plan.workers)]
    await store.redis.zadd(keys.workers, dict.fromkeys(workers, int((time.time() + 3600) * 1000)))
    groups = [[group * 1000 + n for n in range(8 * SYNTHETIC_BLOCK)] for group in range(plan.prefix_groups)]
    holder = {}
    for group, tokens in enumerate(groups):
        model = keys.model("with-affinity")
        holder[group] = workers[group % plan.workers]
        await advertise(
            store.redis,
            model=model,
            worker_id=holder[group],
            blocks=block_hashes(tokens, SYNTHETIC_BLOCK),
            capacity=100_000,
            ttl_seconds=3600,
        )
    group_of: dict[str, int] = {}
    for model_name, affinity in (("without-affinity", False), ("with-affinity", True)):
        for number in range(plan.claim_jobs):
            group = number % plan.prefix_groups
            tokens = groups[group] + [number % 30_000] * SYNTHETIC_BLOCK
            placement = Placement(
                len(tokens), tuple(block_hashes(tokens, SYNTHETIC_BLOCK)) if affinity else ()
            )
            job = JobRequest(prompt_token_ids=tokens, max_tokens=1)
            submitted = await store.submit(job, model=model_name, max_queued=0, placement=placement)
            group_of[submitted.job_id] = group
    rule = Affinity(window=AFFINITY_WINDOW, wait_seconds=0.5, stale_seconds=1.5, blocks_ttl_seconds=3600)

    async def run(model_name: str, affinity: Affinity | None) -> tuple[float, list[tuple[str, str]]]:
        model, taken = keys.model(model_name), list[tuple[str, str]]()
        _, usec = await evalsha(store.redis)
        turn = 0
        while len(taken) < plan.claim_jobs:
            worker = workers[turn % plan.workers]
            turn += 1
            got = await claim(
                store.redis,
                keys=keys,
                model=model,
                worker_id=worker,
                lease_seconds=3600,
                read_limit=100,
                wanted=1,
                affinity=affinity,
                running=0,
            )
            for job_id, _ in got:
                taken.append((job_id, worker))
                await leave_queue(store, model_name, job_id)
            if turn > 20 * plan.claim_jobs:
                raise RuntimeError("the claims stalled")
        _, usec_after = await evalsha(store.redis)
        return (usec_after - usec) / len(taken), taken

    without, _ = await run("without-affinity", None)
    with_affinity, taken = await run("with-affinity", rule)
    ids = [job_id for job_id, _ in taken]
    held = sum(worker == holder[group_of[job_id]] for job_id, worker in taken) / len(taken)
    return ClaimCost(
        plan.claim_jobs,
        plan.prefix_groups,
        plan.workers,
        without,
        with_affinity,
        len(set(ids)) == len(ids) == plan.claim_jobs,
        held,
    )


# Token shares on a synthetic worker.


async def token_shares(settings: Settings, unit: str, plan: SchedulingPlan) -> TokenShares:
    redis = aioredis.Redis.from_url(settings.redis_url, decode_responses=True)
    store = JobStore(redis, Keys.of(settings), settings)
    shapes = {"long": (800, 200), "short": (20, 5)}
    ids: dict[str, list[str]] = {"long": [], "short": []}

    async def keep_backlogged(name: str, until: float) -> None:
        prompt, output = shapes[name]
        while time.monotonic() < until:
            queued = await redis.zcard(store.keys.model(settings.model_name).share_queue_prefix + name)
            for _ in range(max(0, 8 - queued)):
                job = JobRequest(prompt_token_ids=[7] * prompt, max_tokens=output)
                placement = Placement(prompt if unit == "tokens" else None)
                submitted = await store.submit(
                    job, model=settings.model_name, max_queued=0, tenant=Tenant(name), placement=placement
                )
                ids[name].append(submitted.job_id)
            await asyncio.sleep(0.05)

    try:
        until = time.monotonic() + plan.share_seconds
        await asyncio.gather(keep_backlogged("long", until), keep_backlogged("short", until))
        served, ended = dict.fromkeys(shapes, 0), dict.fromkeys(shapes, 0)
        for name, job_ids in ids.items():
            for job_id in job_ids:
                record = await store.record(job_id)
                if record.status is JobState.completed and record.usage is not None:
                    served[name] += record.usage.prompt_tokens + 2 * record.usage.completion_tokens
                    ended[name] += 1
        return TokenShares(unit, served, ended)
    finally:
        await redis.aclose()


def shares_run(url: str, logs: Path, plan: SchedulingPlan, unit: str) -> TokenShares:
    settings = system.bench_settings(
        url, engine="synthetic", synthetic_mean_tokens=0, synthetic_step_seconds=0.01, worker_max_jobs=4
    )
    children: list[system.Child] = []
    try:
        children += [
            system.start_gateway(settings, logs / f"shares-{unit}"),
            system.start_worker(settings, logs / f"shares-{unit}"),
        ]
        system.wait_ready(settings, children, workers=1)
        return asyncio.run(token_shares(settings, unit, plan))
    finally:
        system.tear_down(children, url, settings.key_prefix, None)


def measure(
    url: str, logs: Path, plan: SchedulingPlan, parts: list[str], command: str, say: Callable[[str], None]
) -> Scheduling:
    results = Scheduling(plan)

    def measured(part: str) -> None:
        when = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
        results.measured_by[part] = f"`{command}` ({when})"

    if "claims" in parts:
        measured("claims")
        say("claim cost: queueing and claiming")
        settings = system.bench_settings(url)

        async def claims() -> ClaimCost:
            redis = aioredis.Redis.from_url(url, decode_responses=True)
            try:
                return await claim_cost(JobStore(redis, Keys.of(settings), settings), plan)
            finally:
                await redis.aclose()

        results.claims = _with_cleanup(url, settings, claims)
    if "shares" in parts:
        measured("shares")
        for unit in ("tokens", "jobs"):
            say(f"token shares, counted in {unit}")
            results.shares.append(shares_run(url, logs, plan, unit))
    if "conversations" in parts:
        measured("conversations")
        for affinity in (True, False):
            say(f"conversations on streampool, {'prefix-aware' if affinity else 'no affinity'}")
            results.conversations.append(streampool_conversations(url, logs, plan, affinity))
        say("conversations on one vLLM server")
        results.conversations.append(vllm_conversations(url, logs, plan))
    return results


def _with_cleanup(
    url: str, settings: Settings, run: Callable[[], Coroutine[Any, Any, ClaimCost]]
) -> ClaimCost:
    try:
        return asyncio.run(run())
    finally:
        system.tear_down([], url, settings.key_prefix, None)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="a smoke run of a few minutes")
    parser.add_argument("--parts", default=",".join(PARTS), help="which parts, comma-separated")
    options = parser.parse_args()
    logs = Path(tempfile.mkdtemp(prefix="streampool-bench-scheduling-"))
    redis_server, url = system.start_redis(logs)
    command = shlex.join(["python", "-m", "bench.scheduling", *sys.argv[1:]])
    try:
        results = measure(
            url, logs, QUICK if options.quick else FULL, options.parts.split(","), command, print
        )
    finally:
        redis_server.terminate()
        redis_server.wait()
    kept = results.keeping(report.load().scheduling)
    print(f"rendered {report.record(scheduling=kept)} (logs: {logs})")


if __name__ == "__main__":
    main()
