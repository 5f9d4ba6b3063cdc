"""Prefix-aware claiming end to end: the turns of a conversation, each sent once the last answer has
ended, go to the worker whose cache holds its prefix, through the `openai` package's client of the
gateway; the gateway finds that worker from the blocks the workers advertise, counted with the
model card's tokenizer and cache block size.

On the synthetic system (two workers): the subject is where the queue sends a job, which the
synthetic engine's advertised blocks decide as vLLM's would. That vLLM's own cache then hits is
tests/e2e/test_prefix_cache.py's.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx
import openai
import pytest

from gateway.generation import JOB_ID_HEADER
from tests.conftest import System
from tests.helpers import record

SYSTEM_PROMPT = "You answer questions about the sea. " * 40  # hundreds of tokens: many cache blocks
TURNS = 4


@pytest.fixture(scope="module")
def system(synthetic_system: System) -> System:
    return synthetic_system


@pytest.fixture
async def client(system: System) -> AsyncIterator[openai.AsyncOpenAI]:
    async with openai.AsyncOpenAI(base_url=f"{system.base_url}/v1", api_key="none", max_retries=0) as made:
        yield made


async def conversation(
    client: openai.AsyncOpenAI, http: httpx.AsyncClient, model: str, name: str
) -> list[dict[str, object]]:
    """The job records of a conversation's turns, each sent after the last one's answer."""
    messages: list[dict[str, str]] = [{"role": "system", "content": SYSTEM_PROMPT}]
    records = []
    for turn in range(TURNS):
        messages.append({"role": "user", "content": f"{name}, question {turn}: where do waves come from?"})
        answer = await client.chat.completions.with_raw_response.create(
            model=model,
            messages=messages,
            max_tokens=8,  # type: ignore[arg-type]
        )
        messages.append({"role": "assistant", "content": answer.parse().choices[0].message.content or ""})
        records.append(await record(http, answer.headers[JOB_ID_HEADER]))
    return records


async def test_a_conversations_turns_go_to_the_worker_holding_its_prefix(
    system: System, client: openai.AsyncOpenAI
) -> None:
    async with httpx.AsyncClient(base_url=system.base_url) as http:
        for name in ("Ann", "Bob", "Cid"):
            turns = await conversation(client, http, system.settings.model_name, name)
            workers = [turn["worker"] for turn in turns]
            assert workers[0] is not None and workers == [workers[0]] * TURNS, workers
