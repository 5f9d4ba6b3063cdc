"""The `openai` package's and `huggingface_hub`'s clients, sync and async, of the gateway of a module's
`system` (the session's real engine, or the synthetic one where a module names it); the browser of the
tests of the gateway's pages."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Iterator

import openai
import pytest
from huggingface_hub import AsyncInferenceClient, InferenceClient
from playwright.sync_api import Browser, sync_playwright

from tests.conftest import System
from tests.e2e.browser import CHROMIUM, CHROMIUM_ARGS

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


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    """Debian's Chromium, headless, one per test module."""
    if not os.access(CHROMIUM, os.X_OK):
        pytest.skip(f"no Chromium at {CHROMIUM}: the browser tests need Debian's `chromium` package")
    with sync_playwright() as playwright:
        chromium = playwright.chromium.launch(
            executable_path=str(CHROMIUM), headless=True, args=CHROMIUM_ARGS
        )
        yield chromium
        chromium.close()
