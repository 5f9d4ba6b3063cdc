"""The generation workload both sides run (same prompts, max_tokens, greedy sampling), and its closed loop."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable

from bench.stats import StreamTiming
from shared.requests import ChatMessage, JobRequest

PROMPTS = (
    "Write a short story about a lighthouse keeper who finds a message in a bottle.",
    "Explain how a steam engine works, step by step.",
    "Describe a walk through a busy market in the morning.",
    "Give advice to someone learning to cook for the first time.",
    "Tell me about the history of the bicycle.",
    "Write a letter to a friend describing your last holiday.",
    "Explain why the sky is blue to a ten-year-old.",
    "Describe the life cycle of a butterfly in detail.",
)
SEED = 1234


def request(index: int, max_tokens: int, stream_step: int = 1) -> JobRequest:
    """The `index`-th request: greedy (temperature 0) with a fixed seed, so that both sides match."""
    prompt = PROMPTS[index % len(PROMPTS)]
    return JobRequest(
        messages=[ChatMessage(role="user", content=prompt)],
        max_tokens=max_tokens,
        temperature=0.0,
        seed=SEED,
        stream_step=stream_step,
    )


async def closed_loop(
    concurrency: int,
    rounds: int,
    max_tokens: int,
    run_one: Callable[[JobRequest], Awaitable[StreamTiming]],
    on_done: Callable[[], None],
    requests: Callable[[int, int], JobRequest] = request,
) -> tuple[list[StreamTiming], float, float]:
    """`concurrency` streams at all times, each slot running `rounds` requests back to back.

    Also answers the wall seconds and this (client) process's CPU %, to show the load generator is not
    the bottleneck.
    """

    async def slot(number: int) -> list[StreamTiming]:
        done = []
        for round_ in range(rounds):
            done.append(await run_one(requests(number + round_ * concurrency, max_tokens)))
            on_done()
        return done

    began, cpu_began = time.monotonic(), time.process_time()
    results = await asyncio.gather(*(slot(n) for n in range(concurrency)))
    seconds = time.monotonic() - began
    cpu_percent = 100 * (time.process_time() - cpu_began) / seconds
    return [timing for slot_timings in results for timing in slot_timings], seconds, cpu_percent
