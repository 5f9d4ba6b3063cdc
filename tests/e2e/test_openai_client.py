"""The real `openai` package, sync and async, against the running gateway and workers.

What the client assembles is held against the job record the native API keeps
(`GET /v1/jobs/{id}`), found from `X-Streampool-Job-Id` or the answer's id.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import openai
import pytest
from openai.types import Completion
from openai.types.chat import ChatCompletionChunk, ChatCompletionMessageParam

from tests.conftest import System
from tests.helpers import JOB_DEADLINE_SECONDS, LONG_PROMPT, wait_for_status

JOB_ID_HEADER = "X-Streampool-Job-Id"
QUESTION: list[ChatCompletionMessageParam] = [
    {"role": "user", "content": "What is the capital of France? Answer in one word."}
]
TOO_LONG = "word " * 3000


@pytest.fixture
def sync_openai(system: System) -> Iterator[openai.OpenAI]:
    # No retries: a failure must show as it happened, not as the third attempt.
    with openai.OpenAI(base_url=f"{system.base_url}/v1", api_key="none", max_retries=0) as client:
        yield client


@pytest.fixture
async def async_openai(system: System) -> AsyncIterator[openai.AsyncOpenAI]:
    async with openai.AsyncOpenAI(base_url=f"{system.base_url}/v1", api_key="none", max_retries=0) as client:
        yield client


def _record(system: System, job_id: str) -> dict[str, Any]:
    answer = httpx.get(f"{system.base_url}/v1/jobs/{job_id}", timeout=30)
    assert answer.status_code == 200, answer.text
    record: dict[str, Any] = answer.json()
    return record


def _usage(usage: Any) -> dict[str, int]:
    assert usage is not None
    assert usage.total_tokens == usage.prompt_tokens + usage.completion_tokens
    return {"prompt_tokens": usage.prompt_tokens, "completion_tokens": usage.completion_tokens}


def test_completion_text_and_usage_equal_the_job_record(sync_openai: openai.OpenAI, system: System) -> None:
    raw = sync_openai.completions.with_raw_response.create(
        model=system.settings.model_name, prompt="The three primary colors are", max_tokens=16, temperature=0
    )
    job_id = raw.headers[JOB_ID_HEADER]
    completion = raw.parse()
    record = _record(system, job_id)
    assert (completion.id, completion.object, completion.model) == (
        f"cmpl-{job_id}",
        "text_completion",
        system.settings.model_name,
    )
    choice = completion.choices[0]
    assert record["status"] == "completed"
    assert choice.text == record["output"]["text"] != ""
    assert choice.finish_reason == record["finish_reason"]
    assert _usage(completion.usage) == record["usage"]


def test_chat_stream_assembles_the_record_text_and_ends_with_its_usage(
    sync_openai: openai.OpenAI, system: System
) -> None:
    stream = sync_openai.chat.completions.create(
        model=system.settings.model_name,
        messages=QUESTION,
        max_tokens=16,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    job_id = chunks[0].id.removeprefix("chatcmpl-")
    record = _record(system, job_id)
    assert chunks[0].choices[0].delta.role == "assistant"
    assert {chunk.id for chunk in chunks} == {f"chatcmpl-{job_id}"}
    text = "".join(chunk.choices[0].delta.content or "" for chunk in chunks if chunk.choices)
    assert text == record["output"]["text"] and "paris" in text.lower()
    reasons = [chunk.choices[0].finish_reason for chunk in chunks if chunk.choices]
    assert reasons[-1] == record["finish_reason"] and not any(reasons[:-1])
    assert chunks[-1].choices == []
    assert _usage(chunks[-1].usage) == record["usage"]
    assert all(chunk.usage is None for chunk in chunks[:-1])


async def test_async_chat_completion_equals_the_job_record(
    async_openai: openai.AsyncOpenAI, system: System
) -> None:
    raw = await async_openai.chat.completions.with_raw_response.create(
        model=system.settings.model_name,
        messages=QUESTION,
        max_completion_tokens=16,
        temperature=0,
    )
    job_id = raw.headers[JOB_ID_HEADER]
    chat = raw.parse()
    record = _record(system, job_id)
    assert (chat.id, chat.object) == (f"chatcmpl-{job_id}", "chat.completion")
    message = chat.choices[0].message
    assert message.role == "assistant"
    assert message.content == record["output"]["text"] != ""
    assert chat.choices[0].finish_reason == record["finish_reason"]
    assert _usage(chat.usage) == record["usage"]


async def test_async_completion_stream_with_usage_names_its_job_in_a_header(
    async_openai: openai.AsyncOpenAI, system: System
) -> None:
    async with (
        asyncio.timeout(JOB_DEADLINE_SECONDS),
        async_openai.completions.with_streaming_response.create(
            model=system.settings.model_name,
            prompt=LONG_PROMPT,
            max_tokens=20,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
        ) as response,
    ):
        job_id = response.headers[JOB_ID_HEADER]
        chunks: list[Completion] = [chunk async for chunk in await response.parse()]
    record = _record(system, job_id)
    assert {chunk.id for chunk in chunks} == {f"cmpl-{job_id}"}
    assert "".join(chunk.choices[0].text for chunk in chunks if chunk.choices) == record["output"]["text"]
    assert chunks[-2].choices[0].finish_reason == record["finish_reason"] == "length"
    assert chunks[-1].choices == []
    assert _usage(chunks[-1].usage) == record["usage"]
    assert record["usage"]["completion_tokens"] == 20


def test_models_list_shows_the_served_model(sync_openai: openai.OpenAI, system: System) -> None:
    assert [model.id for model in sync_openai.models.list()] == [system.settings.model_name]


def test_same_seed_gives_the_same_text_through_the_client(sync_openai: openai.OpenAI, system: System) -> None:
    def sample(seed: int) -> str:
        completion = sync_openai.completions.create(
            model=system.settings.model_name,
            prompt="A short poem about the sea:",
            max_tokens=24,
            temperature=0.9,
            seed=seed,
        )
        return completion.choices[0].text

    first = sample(1234)
    assert sample(1234) == first != ""
    assert sample(99) != first


def test_stop_string_ends_the_completion(sync_openai: openai.OpenAI, system: System) -> None:
    completion = sync_openai.completions.create(
        model=system.settings.model_name,
        prompt="List: apple, banana, cherry, date,",
        max_tokens=32,
        temperature=0,
        stop=[","],
    )
    assert completion.choices[0].finish_reason == "stop"
    assert "," not in completion.choices[0].text


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
        assert top[token] == logprob == max(top.values())  # temperature 0: the likeliest token


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
        assert token.top_logprobs[0].token == token.token  # temperature 0: the likeliest token
        assert token.bytes == list(token.token.encode())


@pytest.mark.parametrize(
    ("option", "param"),
    [
        ({"n": 9}, "n"),  # past max_choices (8)
        ({"tools": [{"type": "function", "function": {"name": "get_weather", "parameters": {}}}]}, "tools"),
        (
            {"response_format": {"type": "json_schema", "json_schema": {"name": "no_schema"}}},
            "response_format",
        ),
        ({"tool_choice": "auto"}, "tool_choice"),
    ],
)
def test_unsupported_option_raises_bad_request(
    sync_openai: openai.OpenAI, system: System, option: dict[str, Any], param: str
) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        sync_openai.chat.completions.create(
            model=system.settings.model_name,
            messages=QUESTION,
            max_tokens=4,
            **option,
        )
    assert caught.value.param == param


async def test_unknown_model_raises_not_found(async_openai: openai.AsyncOpenAI) -> None:
    with pytest.raises(openai.NotFoundError) as caught:
        await async_openai.completions.create(model="gpt-4o", prompt="Hi", max_tokens=4)
    assert caught.value.code == "model_not_found"


def test_prompt_too_long_raises_bad_request_with_the_numbers(
    sync_openai: openai.OpenAI, system: System
) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        sync_openai.completions.create(model=system.settings.model_name, prompt=TOO_LONG, max_tokens=16)
    assert "2048" in caught.value.message
    assert caught.value.code == "context_length_exceeded"


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
