"""What the gateway's OpenAI routes make of a job's events, whatever the engine: the real `openai`
package against a gateway and workers on the synthetic engine.

Logprobs in OpenAI's shapes, echo, an error after a stream started, a client that leaves mid-stream;
what the real engine generates through the same routes is in test_openai_client.py.
"""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import openai
import pytest
from openai.types import Completion
from openai.types.chat import ChatCompletionChunk, ChatCompletionMessageParam

from tests.conftest import System
from tests.helpers import JOB_DEADLINE_SECONDS, LONG_PROMPT, wait_for_status

STORY = "Once upon a time, in a small village,"
QUESTION: list[ChatCompletionMessageParam] = [
    {"role": "user", "content": "What is the capital of France? Answer in one word."}
]


@pytest.fixture(scope="module")
def system(synthetic_system: System) -> System:
    """The subject is the routes' shapes and their end of a job, not generation: synthetic workers."""
    return synthetic_system


def test_completion_logprobs_list_each_token_with_its_alternatives(
    sync_openai: openai.OpenAI, system: System
) -> None:
    completion = sync_openai.completions.create(
        model=system.settings.model_name, prompt="Hello", max_tokens=6, temperature=0, logprobs=2
    )
    logprobs = completion.choices[0].logprobs
    assert logprobs is not None and logprobs.tokens and logprobs.top_logprobs and logprobs.token_logprobs
    assert completion.usage is not None
    assert len(logprobs.tokens) == completion.usage.completion_tokens == len(logprobs.text_offset or [])
    for token, logprob, top in zip(
        logprobs.tokens, logprobs.token_logprobs, logprobs.top_logprobs, strict=True
    ):
        assert 1 <= len(top) <= 3
        assert top[token] == logprob == max(top.values())  # the sampled token is among the likeliest


async def test_chat_logprobs_give_top_logprobs_per_token(
    async_openai: openai.AsyncOpenAI, system: System
) -> None:
    chat = await async_openai.chat.completions.create(
        model=system.settings.model_name,
        messages=QUESTION,
        max_tokens=6,
        temperature=0,
        logprobs=True,
        top_logprobs=2,
    )
    choice = chat.choices[0]
    assert choice.logprobs is not None and choice.logprobs.content
    assert chat.usage is not None and len(choice.logprobs.content) == chat.usage.completion_tokens
    for token in choice.logprobs.content:
        assert len(token.top_logprobs) == 2
        assert token.top_logprobs[0].token == token.token  # the sampled token comes first
        assert token.bytes == list(token.token.encode())


@pytest.mark.parametrize("stream", [False, True])
async def test_echo_starts_with_the_prompt(
    async_openai: openai.AsyncOpenAI, system: System, stream: bool
) -> None:
    options: dict[str, Any] = {
        "model": system.settings.model_name,
        "prompt": STORY,
        "max_tokens": 8,
        "temperature": 0,
    }
    plain = await async_openai.completions.create(**options)
    if stream:
        chunks = await async_openai.completions.create(**options, echo=True, stream=True)
        text = "".join([chunk.choices[0].text async for chunk in chunks if chunk.choices])
    else:
        text = (await async_openai.completions.create(**options, echo=True)).choices[0].text
    assert text == STORY + plain.choices[0].text


def test_failure_after_the_stream_started_arrives_as_an_error(
    sync_openai: openai.OpenAI, system: System
) -> None:
    stream = sync_openai.chat.completions.create(
        model=system.settings.model_name,
        messages=[{"role": "user", "content": LONG_PROMPT}],
        max_tokens=1000,
        stream=True,
    )
    chunks: list[ChatCompletionChunk] = []
    with pytest.raises(openai.APIError) as caught:
        for chunk in stream:
            chunks.append(chunk)
            if len(chunks) == 1:  # the role chunk: the stream has started, and its job is running
                job_id = chunk.id.removeprefix("chatcmpl-")
                cancelled = httpx.post(f"{system.base_url}/v1/jobs/{job_id}/cancel", timeout=30)
                assert cancelled.status_code == 202, cancelled.text
    assert caught.value.code == "cancelled"
    assert chunks[0].choices[0].delta.role == "assistant"
    assert all(chunk.choices[0].finish_reason is None for chunk in chunks)


async def test_closing_a_stream_early_cancels_its_job(
    async_openai: openai.AsyncOpenAI, client: httpx.AsyncClient, system: System
) -> None:
    max_tokens = 1000
    stream = await async_openai.completions.create(
        model=system.settings.model_name, prompt=LONG_PROMPT, max_tokens=max_tokens, seed=0, stream=True
    )
    chunks: list[Completion] = []
    async with asyncio.timeout(JOB_DEADLINE_SECONDS):
        async for chunk in stream:
            chunks.append(chunk)
            if len(chunks) == 5:
                break
    await stream.close()
    job_id = chunks[0].id.removeprefix("cmpl-")
    record = await wait_for_status(client, job_id, {"completed", "cancelled", "failed"})
    assert record["status"] == "cancelled"
    assert record["output"]["token_count"] < max_tokens // 4
