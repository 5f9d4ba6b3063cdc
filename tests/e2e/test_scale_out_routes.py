"""Token-level requests through the queue, whatever the engine: vLLM's `/inference/v1/generate`, token ids
and lists of prompts on `/v1/completions` (read with the real `openai` package) and `prompt_token_ids`
on the job API, against a gateway and workers on the synthetic engine.

Every answer is held against the job behind it (`X-Streampool-Job-Id`, and its record and events on the
native API). The shapes, parsed with vLLM's own models, are in tests/gateway/test_scale_out_compat.py;
what the real engine generates for them is in test_scale_out_client.py.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx
import openai
import pytest

from tests.conftest import System
from tests.helpers import JOB_DEADLINE_SECONDS, poll_all, record, streamed_token_ids, wait_for_status

JOB_ID_HEADER = "X-Streampool-Job-Id"
IDS = [504, 3575, 282, 4649, 314]  # "The capital of France is", as the default model tokenizes it
OTHER_IDS = [1, 21873, 17]


@pytest.fixture(scope="module")
def system(synthetic_system: System) -> System:
    """The subject is what the routes make of a job and its events, not generation: synthetic workers."""
    return synthetic_system


def _generate_body(system: System, **fields: Any) -> dict[str, Any]:
    sampling = {"max_tokens": 6, "temperature": 0, **fields.pop("sampling_params", {})}
    return {"model": system.settings.model_name, "token_ids": IDS, "sampling_params": sampling, **fields}


async def _chunks(client: httpx.AsyncClient, body: dict[str, Any]) -> tuple[str, list[dict[str, Any]]]:
    """A streamed answer's job and its chunks, up to `[DONE]`."""
    chunks = []
    async with client.stream("POST", "/inference/v1/generate", json={**body, "stream": True}) as answer:
        assert answer.status_code == 200, (await answer.aread()).decode()
        async for line in answer.aiter_lines():
            if line.startswith("data: "):
                if line == "data: [DONE]":
                    return answer.headers[JOB_ID_HEADER], chunks
                chunks.append(json.loads(line.removeprefix("data: ")))
    raise AssertionError("the stream ended without [DONE]")


async def test_generate_whole_and_streamed_give_the_same_tokens_and_the_jobs(
    client: httpx.AsyncClient, system: System
) -> None:
    whole = await client.post("/inference/v1/generate", json=_generate_body(system, request_id="mine"))
    assert whole.status_code == 200, whole.text
    answer = whole.json()
    (choice,) = answer["choices"]
    assert (answer["request_id"], answer["model"], answer["output_mode"]) == (
        "generate-tokens-mine",
        system.settings.model_name,
        "tokens",
    )
    assert len(choice["token_ids"]) == 6 and choice["finish_reason"] == "length"
    assert answer["usage"] == {
        "prompt_tokens": len(IDS),
        "completion_tokens": 6,
        "total_tokens": len(IDS) + 6,
    }
    job = await record(client, whole.headers[JOB_ID_HEADER])
    assert (job["status"], job["output"]["token_count"], job["usage"]["prompt_tokens"]) == (
        "completed",
        6,
        len(IDS),
    )
    # The job's events replay through the native API, as every route's do.
    events = await poll_all(client, whole.headers[JOB_ID_HEADER])
    assert streamed_token_ids(events) == choice["token_ids"]

    options = {"stream_options": {"include_usage": True}, "return_token_ids": True}
    job_id, chunks = await _chunks(client, _generate_body(system, **options))
    assert chunks[0]["prompt_token_ids"] == IDS
    assert [token for chunk in chunks[:-1] for token in chunk["choices"][0]["token_ids"]] == choice[
        "token_ids"
    ]
    assert chunks[-2]["choices"][0]["finish_reason"] == "length"
    assert (chunks[-1]["choices"], chunks[-1]["usage"]) == ([], answer["usage"])
    assert (await record(client, job_id))["status"] == "completed"


async def test_generate_text_mode_gives_the_text_of_the_tokens(
    client: httpx.AsyncClient, system: System
) -> None:
    body = _generate_body(system, output_mode="text", sampling_params={"logprobs": 1})
    answer = await client.post("/inference/v1/generate", json=body)
    assert answer.status_code == 200, answer.text
    (choice,) = answer.json()["choices"]
    job = await record(client, answer.headers[JOB_ID_HEADER])
    assert choice["text"] == job["output"]["text"] != ""
    assert [position["token"] for position in choice["logprobs"]["content"]] != []
    _, chunks = await _chunks(client, body)
    assert "".join(chunk["choices"][0]["text"] for chunk in chunks) == choice["text"]


async def test_a_client_that_leaves_a_generate_stream_cancels_its_job(
    client: httpx.AsyncClient, system: System
) -> None:
    body = _generate_body(system, stream=True, sampling_params={"max_tokens": 1000, "ignore_eos": True})
    async with asyncio.timeout(JOB_DEADLINE_SECONDS):
        async with client.stream("POST", "/inference/v1/generate", json=body) as answer:
            job_id = answer.headers[JOB_ID_HEADER]
            async for line in answer.aiter_lines():
                if line.startswith("data: "):
                    break  # the first tokens came: leave
    job = await wait_for_status(client, job_id, {"completed", "cancelled", "failed"})
    assert job["status"] == "cancelled" and job["output"]["token_count"] < 1000


async def test_a_generate_stream_cancelled_through_the_job_api_ends_with_vllms_error(
    client: httpx.AsyncClient, system: System
) -> None:
    body = _generate_body(system, stream=True, sampling_params={"max_tokens": 1000, "ignore_eos": True})
    data = []
    async with asyncio.timeout(JOB_DEADLINE_SECONDS):
        async with client.stream("POST", "/inference/v1/generate", json=body) as answer:
            job_id = answer.headers[JOB_ID_HEADER]
            async for line in answer.aiter_lines():
                if line.startswith("data: "):
                    data.append(line.removeprefix("data: "))
                    if len(data) == 1:
                        assert (await client.post(f"/v1/jobs/{job_id}/cancel")).status_code == 202
    assert data[-1] == "[DONE]"
    error = json.loads(data[-2])["error"]
    assert (error["code"], error["type"]) == (410, "Gone")  # vLLM's shape: the status is its code
    assert (await record(client, job_id))["status"] == "cancelled"


async def test_completions_take_token_ids_and_lists_of_prompts_indexed_as_vllm(
    async_openai: openai.AsyncOpenAI, client: httpx.AsyncClient, system: System
) -> None:
    model = system.settings.model_name
    raw = await async_openai.completions.with_raw_response.create(
        model=model, prompt=[IDS, OTHER_IDS], n=2, max_tokens=3, seed=5, extra_body={"ignore_eos": True}
    )
    completion = raw.parse()
    assert [choice.index for choice in completion.choices] == [0, 1, 2, 3]
    assert completion.usage is not None
    assert (completion.usage.prompt_tokens, completion.usage.completion_tokens) == (
        len(IDS) + len(OTHER_IDS),
        12,
    )
    assert all(choice.finish_reason == "length" for choice in completion.choices)
    job = await record(client, raw.headers[JOB_ID_HEADER])
    assert job["output"]["text"] == completion.choices[0].text  # the record holds choice 0
    # Streamed, each choice's chunks carry its index; greedy, a token-id prompt answers as /generate does.
    stream = await async_openai.completions.create(
        model=model, prompt=[IDS, OTHER_IDS], max_tokens=6, temperature=0, stream=True
    )
    texts = ["", ""]
    async for chunk in stream:
        for choice in chunk.choices:
            texts[choice.index] += choice.text
    generated = await client.post("/inference/v1/generate", json=_generate_body(system, output_mode="text"))
    assert texts[0] == generated.json()["choices"][0]["text"] != texts[1]


async def test_the_job_api_takes_prompt_token_ids_and_counts_them_as_given(
    client: httpx.AsyncClient, system: System
) -> None:
    body = {"prompt_token_ids": IDS, "max_tokens": 6, "temperature": 0}
    submitted = await client.post("/v1/jobs", json=body)
    assert submitted.status_code == 202, submitted.text
    job = await wait_for_status(client, submitted.json()["id"], {"completed", "failed"})
    assert (job["status"], job["usage"]) == ("completed", {"prompt_tokens": len(IDS), "completion_tokens": 6})
    whole = await client.post("/inference/v1/generate", json=_generate_body(system))
    events = await poll_all(client, submitted.json()["id"])
    assert streamed_token_ids(events) == whole.json()["choices"][0]["token_ids"]
