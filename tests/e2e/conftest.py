"""The `openai` package's and `huggingface_hub`'s clients, sync and async, of the gateway of a module's
`system` (the session's real engine, or the synthetic one where a module names it)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator

import openai
import pytest
from huggingface_hub import AsyncInferenceClient, InferenceClient

from tests.conftest import System

CLIENT_TIMEOUT = 120  # a job on the session's engines may wait behind other tests' jobs


@pytest.fixture
def sync_openai(system: System) -> Iterator[openai.OpenAI]:
    # No retries: a failure must show as it happened, not as the third attempt.
    with openai.OpenAI(
        base_url=f"{system.base_url}/v1", api_key="none", max_retries=0, timeout=CLIENT_TIMEOUT
    ) as client:
        yield client


@pytest.fixture
async def async_openai(system: System) -> AsyncIterator[openai.AsyncOpenAI]:
    async with openai.AsyncOpenAI(
        base_url=f"{system.base_url}/v1", api_key="none", max_retries=0, timeout=CLIENT_TIMEOUT
    ) as client:
        yield client


@pytest.fixture
def hf(system: System) -> Iterator[InferenceClient]:
    with InferenceClient(system.base_url) as client:
        yield client


@pytest.fixture
async def async_hf(system: System) -> AsyncIterator[AsyncInferenceClient]:
    async with AsyncInferenceClient(system.base_url) as client:
        yield client
