"""The context limit on the running system: the gateway counts prompt tokens exactly as vLLM does.

The gateway counts with the model card the workers published; the worker counts with vLLM's
own tokenizer and reports the count as `usage.prompt_tokens`. They must agree to the token,
or the gateway would refuse prompts that fit, or let through prompts the worker then fails.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
import redis.asyncio as aioredis

from shared.jobstore import JobStore
from shared.model_card import read_model_card
from shared.prompt_tokens import PromptCounter
from shared.requests import JobRequest
from tests.conftest import System
from tests.helpers import submit, wait_for_status

TOO_LONG = "word " * 3000

PROMPTS: list[dict[str, Any]] = [
    {"prompt": "The capital of France is"},
    {"prompt": "  Leading spaces, tabs\tand ünïcödé — 🤖 emoji, 中文, <|im_start|> as text\n\n"},
    {"messages": [{"role": "user", "content": "Name three rivers."}]},
    {
        "messages": [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "Hi!"},
            {"role": "assistant", "content": "Hello. 👋"},
            {"role": "user", "content": "  and again, with <|im_end|> inside\n"},
        ]
    },
]


@pytest.fixture
async def counter(system: System, redis_client: aioredis.Redis) -> PromptCounter:
    card = await read_model_card(redis_client, system.keys, system.settings.model_name)
    assert card is not None, "the workers published no model card"
    assert card.max_model_len == system.settings.max_model_len
    return PromptCounter(card)


@pytest.fixture
async def store(system: System, redis_client: aioredis.Redis) -> AsyncIterator[JobStore]:
    yield JobStore(redis_client, system.keys, system.settings)


@pytest.mark.parametrize("body", PROMPTS, ids=["plain", "plain-unicode", "chat", "chat-turns"])
async def test_the_gateway_counts_prompt_tokens_as_the_worker_does(
    client: httpx.AsyncClient, counter: PromptCounter, body: dict[str, Any]
) -> None:
    job_id = await submit(client, **body, max_tokens=1, temperature=0)
    record = await wait_for_status(client, job_id, {"completed", "failed"})
    assert record["status"] == "completed", record
    assert record["usage"]["prompt_tokens"] == counter.count(JobRequest.model_validate(body))


@pytest.mark.parametrize("body", [PROMPTS[1], PROMPTS[3]], ids=["plain", "chat"])
async def test_a_prompt_that_fills_the_context_to_the_last_token_runs(
    client: httpx.AsyncClient, counter: PromptCounter, system: System, body: dict[str, Any]
) -> None:
    prompt_tokens = counter.count(JobRequest.model_validate(body))
    assert prompt_tokens is not None
    room = system.settings.max_model_len - prompt_tokens
    over = await client.post("/v1/jobs", json={**body, "max_tokens": room + 1})
    assert over.status_code == 413 and over.json()["prompt_tokens"] == prompt_tokens
    # Exactly full: the worker, which checks again with vLLM's count, must agree that it fits.
    job_id = await submit(client, **body, max_tokens=room, temperature=0, stop=[" ", "\n", "."])
    record = await wait_for_status(client, job_id, {"completed", "failed"})
    assert record["status"] == "completed", record


async def test_the_worker_still_refuses_a_prompt_the_gateway_never_saw(
    client: httpx.AsyncClient, store: JobStore
) -> None:
    # Straight into the queue, past the gateway: as from a gateway that has no model card yet.
    job_id = (
        await store.submit(
            JobRequest(prompt=TOO_LONG, max_tokens=16), model=store.settings.model_name, max_queued=0
        )
    ).job_id
    record = await wait_for_status(client, job_id, {"completed", "failed"})
    assert record["status"] == "failed"
    assert "2048" in record["error"]
