"""The real `openai` package, sync and async, against the running gateway and workers on the real engine.

What the client assembles is held against the job record the native API keeps (`GET /v1/jobs/{id}`),
found from `X-Streampool-Job-Id` or the answer's id (a response `resp_<id>` is the job `<id>`).
What the gateway makes of a job's events whatever the engine (logprobs, echo, an error after the
stream started, a client that leaves) is in test_openai_routes.py, and what it keeps of a response in
test_responses_client.py, both on a synthetic system; its refusals are in
tests/gateway/test_client_refusals.py.
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import httpx
import openai
from httpx_sse import connect_sse
from openai.types import Completion
from openai.types.chat import ChatCompletionMessageParam

from tests.conftest import System
from tests.helpers import JOB_DEADLINE_SECONDS, LONG_PROMPT, completed_batch, job_record
from tests.open_responses import suite_request, valid_events

JOB_ID_HEADER = "X-Streampool-Job-Id"
TERMINAL = {"completed", "incomplete", "cancelled", "failed"}  # a response's last statuses
QUESTION: list[ChatCompletionMessageParam] = [
    {"role": "user", "content": "What is the capital of France? Answer in one word."}
]


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
    record = job_record(system.base_url, job_id)
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
    record = job_record(system.base_url, job_id)
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
    record = job_record(system.base_url, job_id)
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
    record = job_record(system.base_url, job_id)
    assert {chunk.id for chunk in chunks} == {f"cmpl-{job_id}"}
    assert "".join(chunk.choices[0].text for chunk in chunks if chunk.choices) == record["output"]["text"]
    assert chunks[-2].choices[0].finish_reason == record["finish_reason"] == "length"
    assert chunks[-1].choices == []
    assert _usage(chunks[-1].usage) == record["usage"]
    assert record["usage"]["completion_tokens"] == 20


def test_background_response_polled_to_completed_has_the_job_records_text_and_usage(
    sync_openai: openai.OpenAI, system: System
) -> None:
    created = sync_openai.responses.create(
        model=system.settings.model_name,
        input="Name three colors.",
        instructions="Answer briefly.",
        background=True,
        max_output_tokens=24,
        temperature=0,
        metadata={"ticket": "42"},
    )
    assert (created.status, created.background, created.metadata) == ("queued", True, {"ticket": "42"})
    response = created
    while response.status not in TERMINAL:  # bounded by the test's timeout, as a client polls
        time.sleep(0.1)
        response = sync_openai.responses.retrieve(created.id)
    record = job_record(system.base_url, created.id)
    assert response.status in ("completed", "incomplete") and record["status"] == "completed"
    assert response.output_text == record["output"]["text"] != ""
    assert response.usage is not None
    assert (response.usage.input_tokens, response.usage.output_tokens) == (
        record["usage"]["prompt_tokens"],
        record["usage"]["completion_tokens"],
    )
    assert (response.instructions, response.metadata) == ("Answer briefly.", {"ticket": "42"})
    items = sync_openai.responses.input_items.list(created.id)
    assert [(item.role, item.content[0].text) for item in items.data] == [("user", "Name three colors.")]


def test_sdk_stream_by_response_id_gives_the_final_response(
    sync_openai: openai.OpenAI, system: System
) -> None:
    created = sync_openai.responses.create(
        model=system.settings.model_name,
        input="Say hello.",
        background=True,
        max_output_tokens=64,
        temperature=0,
    )
    with sync_openai.responses.stream(response_id=created.id) as stream:
        texts = [event.delta for event in stream if event.type == "response.output_text.delta"]
        final = stream.get_final_response()
    assert final.status == "completed" and final.output_text == "".join(texts) != ""
    with sync_openai.responses.stream(response_id=created.id, starting_after=4) as stream:
        numbers = [event.sequence_number for event in stream]
    assert numbers[0] == 5


def test_the_open_responses_suites_basic_request_streamed_on_the_engine_validates_and_completes(
    system: System,
) -> None:
    """Greedy, so that the answer is the same each run (six tokens; its streaming test's "Count from 1
    to 5." goes on past any bound), every event validated by the specification's models; the other text
    tests are in test_responses_compliance.py."""
    body = suite_request("basic-response", system.settings.model_name) | {"stream": True, "temperature": 0}
    with (
        httpx.Client(base_url=system.base_url, timeout=JOB_DEADLINE_SECONDS) as http,
        connect_sse(http, "POST", "/v1/responses", json=body) as source,
    ):
        assert source.response.status_code == 200, source.response.read()
        events = [json.loads(sse.data) for sse in source.iter_sse() if sse.data]
    response = valid_events(events)
    text = "".join(event["delta"] for event in events if event["type"] == "response.output_text.delta")
    assert response.status == "completed"
    assert text == job_record(system.base_url, response.id)["output"]["text"]
    assert (response.temperature, response.top_p, response.presence_penalty) == (0.0, 1.0, 0.0)


def test_a_batch_answers_each_custom_id_once_with_what_a_direct_greedy_request_answers(
    sync_openai: openai.OpenAI, system: System
) -> None:
    """A batch's jobs run on the engine as any job does: each line's output is the text the same
    request gets directly (greedy), once, under its custom_id."""
    model = system.settings.model_name
    questions = ["What is the capital of France?", "Name a primary color.", "What is 2 + 2?"]
    bodies = [
        {
            "model": model,
            "messages": [{"role": "user", "content": question}],
            "max_tokens": 12,
            "temperature": 0,
        }
        for question in questions
    ]
    lines = [
        {"custom_id": f"q{n}", "method": "POST", "url": "/v1/chat/completions", "body": body}
        for n, body in enumerate(bodies)
    ]
    output = completed_batch(sync_openai, lines, "/v1/chat/completions")
    assert [line["custom_id"] for line in output] == ["q0", "q1", "q2"]
    for line, body in zip(output, bodies, strict=True):
        direct = sync_openai.chat.completions.create(**body)
        assert line["response"]["status_code"] == 200
        assert (
            line["response"]["body"]["choices"][0]["message"]["content"] == direct.choices[0].message.content
        )


def test_each_model_lists_its_workers_engine_arguments_as_their_heartbeats_carry_them(system: System) -> None:
    """The real workers' engine arguments away from `vllm serve`'s defaults (streampool's own: the
    pool's context, CPU placement's eager mode), read by vLLM's parser at their start, reach
    `/v1/models` through their heartbeats: both workers of the pool run one configuration."""
    models = httpx.get(f"{system.base_url}/v1/models", timeout=30).json()["data"]
    (model,) = [entry for entry in models if entry["id"] == system.settings.model_name]
    (engine_args,) = model["engine_args"]
    assert engine_args["max_model_len"] == str(system.settings.max_model_len)
    assert engine_args["enforce_eager"] == "True"
