"""Tokens in, tokens out beside vLLM's own server: `POST /inference/v1/generate`, streamed, driven the same
way against both servers.

vLLM's benchmark client has no backend for this route, so this is the least client that measures it as
that client measures the others: prompts of random token ids from the model's vocabulary (fixed seed),
`ignore_eos` so that every request generates exactly its output length, temperature 0; at each level
one warm-up request, then the level's requests with at most `concurrency` in flight. Each request's
clock starts before its POST; its first token is the first chunk that carries token ids, and the gap
to each later chunk is spread over that chunk's tokens (`StreamTiming`); its output tokens are the
final chunk's usage. Output tokens/s are the level's tokens over its wall time. A request that fails
(not 200, or no token) counts as failed, and its figures are left out, as vLLM's client does.
"""

from __future__ import annotations

import json
import random
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

from bench.jobclient import client
from bench.peer import PeerPlan
from bench.peer_figures import PeerLevel, PeerRun
from bench.sse_client import sse_events
from bench.stats import StreamTiming, summarize
from bench.workload import closed_loop
from shared.requests import JobRequest

GENERATE_PATH = "/inference/v1/generate"
DONE = "[DONE]"


def token_prompts(vocabulary: int, length: int, count: int, seed: int) -> list[list[int]]:
    """`count` prompts of `length` ids drawn uniformly from the vocabulary, the same for a seed."""
    draw = random.Random(seed)
    return [[draw.randrange(vocabulary) for _ in range(length)] for _ in range(count)]


def vocabulary_size(model: Path) -> int:
    """The model's vocabulary as its config gives it: the ids vLLM and the gateway take in a prompt."""
    size = json.loads((model / "config.json").read_text()).get("vocab_size")
    if not isinstance(size, int):
        raise RuntimeError(f"{model}/config.json gives no vocab_size")
    return size


def body(model: str, request: JobRequest) -> dict[str, Any]:
    """The streamed generate request for a job's token-id prompt and sampling."""
    return {
        "model": model,
        "token_ids": request.prompt_token_ids,
        "sampling_params": {
            "max_tokens": request.max_tokens,
            "temperature": request.temperature,
            "ignore_eos": request.ignore_eos,
        },
        "stream": True,
        "stream_options": {"include_usage": True},
    }


def read_chunk(data: str, timing: StreamTiming, at: float) -> None:
    """One streamed chunk into `timing`: its tokens' arrival, or the final usage's output tokens."""
    if data == DONE:
        return
    chunk = json.loads(data)
    tokens = sum(len(choice.get("token_ids") or []) for choice in chunk.get("choices") or [])
    timing.add(at, tokens)
    timing.tokens += tokens
    if usage := chunk.get("usage"):
        timing.tokens = int(usage["completion_tokens"])


async def generate(http: httpx.AsyncClient, model: str, request: JobRequest) -> StreamTiming:
    """One streamed request; a failure answers a timing with no arrivals."""
    timing = StreamTiming(started=time.monotonic())
    try:
        async with http.stream("POST", GENERATE_PATH, json=body(model, request)) as answer:
            if answer.status_code != 200:
                await answer.aread()
                return StreamTiming(started=timing.started)
            async for _, data in sse_events(answer.aiter_lines()):
                read_chunk(data, timing, time.monotonic())
    except httpx.HTTPError:
        return StreamTiming(started=timing.started)
    return timing


def level_figures(concurrency: int, timings: list[StreamTiming], seconds: float) -> PeerLevel:
    """A level's figures in the shape of vLLM's client's (latencies in ms), of its requests that
    succeeded."""
    done = [timing for timing in timings if timing.arrivals]
    summary = summarize(concurrency, done, seconds, client_cpu_percent=0.0)
    return PeerLevel(
        concurrency=concurrency,
        completed=len(done),
        failed=len(timings) - len(done),
        output_tokens=summary.tokens,
        output_tokens_per_second=summary.tokens_per_second,
        ttft_p50=summary.ttft_p50 * 1000,
        ttft_p99=summary.ttft_p99 * 1000,
        itl_p50=summary.itl_p50 * 1000,
        itl_p99=summary.itl_p99 * 1000,
    )


async def run(
    side: str, base_url: str, model: Path, served_name: str, plan: PeerPlan, on_level: Callable[[], None]
) -> PeerRun:
    """Every level of `plan` in turn against `base_url`; a level's requests are its prompts, each level
    drawing from the same seeded prompts as vLLM's random dataset does."""
    most = max(prompts for _, prompts in plan.levels)
    prompts = token_prompts(vocabulary_size(model), plan.input_len, most, plan.seed)

    def job(index: int, max_tokens: int) -> JobRequest:
        return JobRequest(
            prompt_token_ids=prompts[index], max_tokens=max_tokens, temperature=0.0, ignore_eos=True
        )

    result = PeerRun(side)
    async with client(base_url) as http:

        async def one(request: JobRequest) -> StreamTiming:
            return await generate(http, served_name, request)

        for concurrency, count in plan.levels:
            await closed_loop(1, 1, plan.output_len, one, lambda: None, job)  # warm-up, not measured
            timings, seconds, _ = await closed_loop(
                concurrency, count // concurrency, plan.output_len, one, lambda: None, job
            )
            result.levels.append(level_figures(concurrency, timings, seconds))
            on_level()
    return result
