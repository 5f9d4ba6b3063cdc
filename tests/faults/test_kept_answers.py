"""OpenAI answers that outlive their client: a stored chat completion (`store: true`), or a request sent
with `X-Streampool-Keep-Running: true`, runs to its end when its client leaves, and its stream is
resumed through another gateway with the chunks the client did not get, each once, in the original's
framing, read by the `openai` package; a worker killed mid-answer leaves one whole answer. Without
either, a client that leaves still cancels its job.

The second gateway is one run in this process on the pool's settings: another app, relay and stream
hub on the same Redis, as a gateway beside it in a deployment."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from typing import Any, TypeVar

import httpx
import openai
import pytest
from openai.types import Completion
from openai.types.chat import ChatCompletionChunk, ChatCompletionMessageParam
from pydantic import BaseModel

from gateway.resumption import KEEP_RUNNING_HEADER
from tests.faults.conftest import WAIT_TIMEOUT, Pool, wait_for_tokens
from tests.helpers import LONG_PROMPT, eventually, in_process_gateway, resumed_chunks, wait_for_status

MAX_TOKENS = 60  # two seconds on the synthetic engine: the 10th chunk comes well before the end
STORY: list[ChatCompletionMessageParam] = [{"role": "user", "content": LONG_PROMPT}]
ENDED = {"completed", "cancelled", "failed"}

Chunk = TypeVar("Chunk", ChatCompletionChunk, Completion)


@pytest.fixture(scope="module")
def pool(synthetic_pool: Pool) -> Pool:
    """On the synthetic engine: the subject is the relay, the leases and the framing, not generation."""
    return synthetic_pool


@pytest.fixture
async def sdk(pool: Pool) -> AsyncIterator[openai.AsyncOpenAI]:
    async with openai.AsyncOpenAI(
        base_url=f"{pool.base_url}/v1", api_key="none", max_retries=0, timeout=WAIT_TIMEOUT
    ) as client:
        yield client


@pytest.fixture
async def other_sdk(pool: Pool) -> AsyncIterator[openai.AsyncOpenAI]:
    """The `openai` package on a second gateway."""
    async with in_process_gateway(pool.settings) as http:
        http.timeout = httpx.Timeout(WAIT_TIMEOUT)
        yield openai.AsyncOpenAI(
            base_url="http://gateway/v1", api_key="none", http_client=http, max_retries=0
        )


async def first_chunks(stream: openai.AsyncStream[Chunk], count: int) -> list[Chunk]:
    """The stream's first `count` chunks; then the client goes away (the connection closed)."""
    chunks: list[Chunk] = []
    async with asyncio.timeout(WAIT_TIMEOUT):
        async for chunk in stream:
            chunks.append(chunk)
            if len(chunks) == count:
                break
    await stream.close()
    return chunks


def dumped(chunks: list[Any]) -> list[dict[str, Any]]:
    return [chunk.model_dump() for chunk in chunks if isinstance(chunk, BaseModel)]


def chat_text(chunks: list[ChatCompletionChunk]) -> str:
    return "".join(chunk.choices[0].delta.content or "" for chunk in chunks if chunk.choices)


async def test_a_stored_chat_whose_client_left_at_its_tenth_chunk_ends_and_resumes_elsewhere_chunk_for_chunk(
    pool: Pool, client: httpx.AsyncClient, sdk: openai.AsyncOpenAI, other_sdk: openai.AsyncOpenAI
) -> None:
    pool.ensure_workers()
    stream = await sdk.chat.completions.create(
        model=pool.settings.model_name,
        messages=STORY,
        max_tokens=MAX_TOKENS,
        stream=True,
        store=True,
        stream_options={"include_usage": True},
    )
    first = await first_chunks(stream, 10)
    job_id = first[0].id.removeprefix("chatcmpl-")
    job = await wait_for_status(client, job_id, ENDED)
    assert job["status"] == "completed", job
    assert job["output"]["token_count"] == MAX_TOKENS

    path = f"/chat/completions/{first[0].id}/chunks"
    rest = await resumed_chunks(other_sdk, path, ChatCompletionChunk, 10)
    whole = await resumed_chunks(other_sdk, path, ChatCompletionChunk, 0)
    assert dumped(whole[:10]) == dumped(first)  # the same chunks: ids, `created`, `model` and all
    assert dumped(whole[10:]) == dumped(rest)
    assert len(rest) > 10
    assert chat_text(whole) == job["output"]["text"]
    assert [chunk.choices[0].finish_reason for chunk in whole if chunk.choices].count("length") == 1
    assert whole[-1].usage is not None and whole[-1].usage.completion_tokens == MAX_TOKENS
    # By the job id of X-Streampool-Job-Id as well; a chat completion's as a completion is a 404.
    by_job_id = await resumed_chunks(other_sdk, f"/chat/completions/{job_id}/chunks", ChatCompletionChunk, 10)
    assert dumped(by_job_id) == dumped(rest)
    with pytest.raises(openai.NotFoundError):
        await resumed_chunks(other_sdk, f"/completions/{job_id}/chunks", Completion, 0)


async def test_a_completion_kept_by_its_header_runs_on_and_resumes_while_it_runs(
    pool: Pool, client: httpx.AsyncClient, sdk: openai.AsyncOpenAI, other_sdk: openai.AsyncOpenAI
) -> None:
    """Resumed while the job still runs: the chunks made again, then live ones, up to its end."""
    pool.ensure_workers()
    stream = await sdk.completions.create(
        model=pool.settings.model_name,
        prompt=LONG_PROMPT,
        max_tokens=MAX_TOKENS * 2,
        stream=True,
        extra_headers={KEEP_RUNNING_HEADER: "true"},
    )
    first = await first_chunks(stream, 5)
    rest = await resumed_chunks(other_sdk, f"/completions/{first[0].id}/chunks", Completion, 5)
    job = await wait_for_status(client, first[0].id.removeprefix("cmpl-"), ENDED)
    assert job["status"] == "completed", job
    assert "".join(chunk.choices[0].text for chunk in first + rest if chunk.choices) == job["output"]["text"]
    assert [chunk.choices[0].finish_reason for chunk in rest] == [None] * (len(rest) - 1) + ["length"]


async def test_a_whole_stored_chat_whose_client_gave_up_waiting_completes(
    pool: Pool, client: httpx.AsyncClient, sdk: openai.AsyncOpenAI
) -> None:
    pool.ensure_workers()
    tag = {"probe": uuid.uuid4().hex}
    with pytest.raises(openai.APITimeoutError):  # four seconds of answer: the client leaves after one
        await sdk.with_options(timeout=1.0).chat.completions.create(
            model=pool.settings.model_name,
            messages=STORY,
            max_tokens=MAX_TOKENS * 2,
            store=True,
            metadata=tag,
        )

    async def listed() -> list[Any]:
        return (await sdk.chat.completions.list(metadata=tag)).data

    # Listed once its job has completed (a stored completion is one that was answered).
    [stored] = await eventually(listed, "the stored chat completion", WAIT_TIMEOUT)
    job = await wait_for_status(client, stored.id.removeprefix("chatcmpl-"), ENDED)
    assert (job["status"], job["output"]["token_count"]) == ("completed", MAX_TOKENS * 2)
    assert stored.choices[0].message.content == job["output"]["text"]


async def test_a_chat_neither_stored_nor_kept_is_cancelled_when_its_client_leaves_and_cannot_be_resumed(
    pool: Pool, client: httpx.AsyncClient, sdk: openai.AsyncOpenAI, other_sdk: openai.AsyncOpenAI
) -> None:
    pool.ensure_workers()
    stream = await sdk.chat.completions.create(
        model=pool.settings.model_name, messages=STORY, max_tokens=1000, stream=True, store=False
    )
    first = await first_chunks(stream, 5)
    job = await wait_for_status(client, first[0].id.removeprefix("chatcmpl-"), ENDED)
    assert job["status"] == "cancelled"
    with pytest.raises(openai.NotFoundError) as refused:
        await resumed_chunks(other_sdk, f"/chat/completions/{first[0].id}/chunks", ChatCompletionChunk, 0)
    assert "kept running" in refused.value.message


async def test_a_stored_chat_whose_worker_is_killed_mid_answer_still_gives_one_whole_answer(
    pool: Pool, client: httpx.AsyncClient, sdk: openai.AsyncOpenAI, other_sdk: openai.AsyncOpenAI
) -> None:
    """The worker dies with its engine (SIGKILL); another takes the job over once its lease runs out
    and goes on from the tokens in its stream: the client that stayed and one that resumes from the
    start read the same answer, each chunk once."""
    pool.ensure_workers()
    max_tokens = 200
    stream = await sdk.chat.completions.create(
        model=pool.settings.model_name, messages=STORY, max_tokens=max_tokens, stream=True, store=True
    )
    chunks: list[ChatCompletionChunk] = []
    async with asyncio.timeout(WAIT_TIMEOUT):
        async for chunk in stream:
            chunks.append(chunk)
            if len(chunks) == 1:
                job_id = chunk.id.removeprefix("chatcmpl-")
                running = await wait_for_tokens(client, job_id, 10)
                pool.processes.kill(pool.worker_named(running["worker"]))
    job = await wait_for_status(client, job_id, ENDED)
    assert job["status"] == "completed", job
    assert (job["output"]["token_count"], job["attempts"]) == (max_tokens, 2)  # taken over midway

    replayed = await resumed_chunks(other_sdk, f"/chat/completions/{job_id}/chunks", ChatCompletionChunk, 0)
    assert dumped(replayed) == dumped(chunks)
    assert chat_text(chunks) == job["output"]["text"] != ""
    assert [chunk.choices[0].delta.role for chunk in chunks].count("assistant") == 1
    assert [chunk.choices[0].finish_reason for chunk in chunks][-1] == "length"
