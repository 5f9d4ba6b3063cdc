"""The real `openai` package, sync and async, against the running gateway and workers on the real engine.

What the client assembles is held against the job record the native API keeps
(`GET /v1/jobs/{id}`), found from `X-Streampool-Job-Id` or the answer's id. What the gateway makes
of a job's events whatever the engine (logprobs, an error after the stream started, a client that
leaves) is in test_openai_routes.py, on a synthetic system; its refusals are in
tests/gateway/test_client_refusals.py.
"""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import openai
from openai.types import Completion
from openai.types.chat import ChatCompletionMessageParam

from tests.conftest import System
from tests.helpers import JOB_DEADLINE_SECONDS, LONG_PROMPT

JOB_ID_HEADER = "X-Streampool-Job-Id"
QUESTION: list[ChatCompletionMessageParam] = [
    {"role": "user", "content": "What is the capital of France? Answer in one word."}
]


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
