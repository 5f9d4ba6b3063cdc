"""The Responses API through the real `openai` package against the session's gateway and workers on the
synthetic engine, and gateways of the tests' own on the same Redis (a second one to resume through, one
restarted under a background response).

The subject is what the gateway keeps and serves of a response (its events, its cancel, its
conversation, its life across gateways), not generation; a response on the real engine is in
test_openai_client.py. What the client assembles is held against the job record of the native API
(`GET /v1/jobs/{id}`): a response `resp_<id>` is the job `<id>`.

The last tests run a pool of their own, started with vLLM's hermes tool-call parser and qwen3
reasoning parser on the synthetic engine with a script: the default model cannot write `<think>` nor
`<tool_call>`, so the scripted output stands in for a model that does, and vLLM's parsers run on it
through the worker, the job's stream and the Responses framing.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import openai
import pytest
import redis.asyncio as aioredis
from agents import OpenAIResponsesModel, Runner
from openai.types.responses import Response

from cli.launcher import wait_healthy
from shared.jobstore import JobStore
from tests.conftest import SYSTEM_START_TIMEOUT, WORKERS, System
from tests.helpers import JOB_DEADLINE_SECONDS, LONG_PROMPT, eventually, job_record
from tests.processes import Processes, free_port
from tests.scripted_pool import ANSWER, ARGUMENTS, REASONING
from tests.weather_agent import weather_agent

TERMINAL = {"completed", "incomplete", "cancelled", "failed"}
ENDS = {"response.completed", "response.incomplete", "response.cancelled", "response.failed"}


@pytest.fixture(scope="module")
def system(synthetic_system: System) -> System:
    return synthetic_system


def _client(base_url: str) -> openai.AsyncOpenAI:
    # No retries: a failure must show as it happened, not as the third attempt.
    return openai.AsyncOpenAI(base_url=f"{base_url}/v1", api_key="none", max_retries=0, timeout=120)


@dataclass
class Gateways:
    """Gateway processes of the test's own on the session's settings (the same Redis and workers),
    named by their port."""

    system: System
    processes: Processes

    def start(self, port: int) -> str:
        """A gateway on `port`; its base URL once it counts the workers."""
        settings = self.system.settings.model_copy(update={"port": port})
        process = self.processes.start(f"gateway-{port}", "gateway", settings)
        base_url = f"http://127.0.0.1:{port}"
        healthy = wait_healthy(base_url, [process], WORKERS, SYSTEM_START_TIMEOUT)
        assert healthy, f"logs in {self.processes.log_dir}"
        return base_url

    def stop(self, port: int) -> None:
        self.processes.stop(f"gateway-{port}")


@pytest.fixture
def gateways(system: System, tmp_path: Path) -> Iterator[Gateways]:
    processes = Processes(tmp_path)
    try:
        yield Gateways(system, processes)
    finally:
        processes.stop_all()


async def _finished(client: openai.AsyncOpenAI, response_id: str) -> Response:
    return await eventually(
        lambda: client.responses.retrieve(response_id),
        f"response {response_id} ends",
        JOB_DEADLINE_SECONDS,
        interval=0.2,
        until=lambda response: response.status in TERMINAL,
    )


async def test_a_dropped_background_stream_resumes_through_a_second_gateway_without_gap_or_duplicate(
    async_openai: openai.AsyncOpenAI, system: System, gateways: Gateways
) -> None:
    second = _client(await asyncio.to_thread(gateways.start, free_port()))
    stream = await async_openai.responses.create(
        model=system.settings.model_name,
        input=LONG_PROMPT,
        background=True,
        stream=True,
        max_output_tokens=60,
        temperature=0,
    )
    first: list[Any] = []
    async for event in stream:
        first.append(event)
        if event.type == "response.output_text.delta" and len(first) >= 8:
            break
    await stream.close()  # the client drops; the response goes on
    response_id = first[0].response.id
    rest = [
        event
        async for event in await second.responses.retrieve(
            response_id, stream=True, starting_after=first[-1].sequence_number
        )
    ]
    events = first + rest
    assert [event.sequence_number for event in events] == list(range(len(events)))
    assert rest[-1].type in ENDS and rest[-1].type != "response.cancelled"
    final = await second.responses.retrieve(response_id)
    text = "".join(event.delta for event in events if event.type == "response.output_text.delta")
    assert (
        text
        == final.output_text
        == rest[-1].response.output_text
        == job_record(system.base_url, response_id)["output"]["text"]
    )
    whole = [event async for event in await async_openai.responses.retrieve(response_id, stream=True)]
    assert [event.model_dump() for event in whole] == [event.model_dump() for event in events]
    await second.close()


async def test_cancel_mid_generation_ends_cancelled_with_the_text_so_far(
    async_openai: openai.AsyncOpenAI, system: System
) -> None:
    created = await async_openai.responses.create(
        model=system.settings.model_name,
        input=LONG_PROMPT,
        background=True,
        max_output_tokens=1000,
        temperature=0,
    )

    async def tokens() -> int:
        return int(job_record(system.base_url, created.id)["output"]["token_count"])

    await eventually(
        tokens, "the response generates", JOB_DEADLINE_SECONDS, interval=0.1, until=lambda n: n >= 3
    )
    cancelled = await async_openai.responses.cancel(created.id)
    record = job_record(system.base_url, created.id)
    assert (cancelled.status, record["status"]) == ("cancelled", "cancelled")
    assert 3 <= record["output"]["token_count"] < 1000
    assert cancelled.output_text == record["output"]["text"]
    assert (await async_openai.responses.cancel(created.id)).status == "cancelled"  # idempotent
    events = [event async for event in await async_openai.responses.retrieve(created.id, stream=True)]
    assert events[-1].type == "response.cancelled"
    assert events[-1].response["status"] == "cancelled"  # a type the package has no model of: a dict
    await async_openai.responses.delete(created.id)
    with pytest.raises(openai.NotFoundError):
        await async_openai.responses.retrieve(created.id)


async def test_previous_response_id_carries_the_conversation_over(
    async_openai: openai.AsyncOpenAI, system: System, redis_client: aioredis.Redis
) -> None:
    first = await async_openai.responses.create(
        model=system.settings.model_name,
        input="My name is Ada. Say hi.",
        max_output_tokens=12,
        temperature=0,
        instructions="Be brief.",
    )
    assert first.status in ("completed", "incomplete") and first.output_text
    second = await async_openai.responses.create(
        model=system.settings.model_name,
        input="What is my name?",
        previous_response_id=first.id,
        max_output_tokens=12,
        temperature=0,
    )
    assert second.previous_response_id == first.id and second.output_text
    job_id = second.id.removeprefix("resp_")
    request = json.loads(await redis_client.hget(system.keys.job(job_id), "request"))
    assert request["messages"] == [{"role": "user", "content": "What is my name?"}]  # each turn its own
    conversation = await JobStore(redis_client, system.keys, system.settings).conversation(job_id)
    assert [(message.role, message.content) for message in conversation] == [
        ("user", "My name is Ada. Say hi."),  # the first's instructions are not carried over, as on OpenAI
        ("assistant", first.output_text),
        ("user", "What is my name?"),
        ("assistant", second.output_text),
    ]


async def test_a_foreground_response_waits_and_can_be_neither_cancelled_nor_streamed_again(
    async_openai: openai.AsyncOpenAI, system: System
) -> None:
    cut = await async_openai.responses.create(
        model=system.settings.model_name, input=LONG_PROMPT, max_output_tokens=5, temperature=0
    )
    assert cut.status == "incomplete" and cut.incomplete_details is not None
    assert cut.incomplete_details.reason == "max_output_tokens" and cut.usage and cut.usage.output_tokens == 5
    with pytest.raises(openai.BadRequestError, match="background"):
        await async_openai.responses.cancel(cut.id)
    with pytest.raises(openai.BadRequestError, match="background"):
        await async_openai.responses.retrieve(cut.id, stream=True)
    streamed = await async_openai.responses.create(
        model=system.settings.model_name, input="Say hi.", stream=True, max_output_tokens=8, temperature=0
    )
    events = [event async for event in streamed]
    assert events[-1].type in ENDS and [e.sequence_number for e in events] == list(range(len(events)))
    unstored = await async_openai.responses.create(
        model=system.settings.model_name, input="Say hi.", store=False, max_output_tokens=4, temperature=0
    )
    assert unstored.store is False and unstored.output_text
    with pytest.raises(openai.NotFoundError):
        await async_openai.responses.retrieve(unstored.id)


async def test_a_background_response_outlives_a_gateway_restart(system: System, gateways: Gateways) -> None:
    port = free_port()
    async with _client(await asyncio.to_thread(gateways.start, port)) as before:
        created = await before.responses.create(
            model=system.settings.model_name,
            input=LONG_PROMPT,
            background=True,
            max_output_tokens=40,
            temperature=0,
        )
    await asyncio.to_thread(gateways.stop, port)
    async with _client(
        await asyncio.to_thread(gateways.start, port)
    ) as after:  # the same address, a new process
        response = await _finished(after, created.id)
        assert response.output_text == job_record(system.base_url, created.id)["output"]["text"] != ""
        events = [event async for event in await after.responses.retrieve(created.id, stream=True)]
    assert events[-1].response.output_text == response.output_text


WEATHER: Any = {
    "type": "function",
    "name": "get_weather",
    "description": "The weather in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    "strict": False,
}
QUESTION = "What is the weather in Paris?"


@pytest.fixture
async def tool_client(tool_system: System) -> AsyncIterator[openai.AsyncOpenAI]:
    async with _client(tool_system.base_url) as client:
        yield client


async def test_a_streamed_response_with_tools_streams_the_reasoning_and_the_function_call(
    tool_client: openai.AsyncOpenAI, tool_system: System
) -> None:
    """The scripted output stands in for a model that thinks and calls a tool in hermes' syntax: the
    stream has a reasoning item, then a function_call item whose argument deltas add up to the call,
    and the Response, as streamed and as read back, holds both."""
    model = tool_system.settings.model_name
    events = [
        event
        async for event in await tool_client.responses.create(
            model=model, input=QUESTION, tools=[WEATHER], stream=True
        )
    ]
    assert [event.sequence_number for event in events] == list(range(len(events)))
    final = events[-1]
    assert final.type == "response.completed"
    added = [event.item for event in events if event.type == "response.output_item.added"]
    assert [item.type for item in added] == ["reasoning", "function_call"]
    call = added[1]
    assert call.type == "function_call" and call.name == "get_weather" and call.call_id
    arguments = "".join(
        event.delta for event in events if event.type == "response.function_call_arguments.delta"
    )
    [arguments_done] = [event for event in events if event.type == "response.function_call_arguments.done"]
    assert json.loads(arguments) == ARGUMENTS and arguments_done.arguments == arguments
    assert "".join(event.delta for event in events if event.type == "response.reasoning.delta") == REASONING
    done = [event.item for event in events if event.type == "response.output_item.done"]
    assert [item.model_dump() for item in done] == [item.model_dump() for item in final.response.output]
    reasoning, streamed_call = final.response.output
    assert reasoning.type == "reasoning" and reasoning.content and reasoning.content[0].text == REASONING
    assert streamed_call.type == "function_call" and json.loads(streamed_call.arguments) == ARGUMENTS
    stored = await tool_client.responses.retrieve(final.response.id)
    assert [item.model_dump() for item in stored.output] == [
        item.model_dump() for item in final.response.output
    ]
    whole = await tool_client.responses.create(model=model, input=QUESTION, tools=[WEATHER])
    assert [item.type for item in whole.output] == ["reasoning", "function_call"]


async def test_a_function_call_output_history_makes_a_job_with_the_tool_messages(
    tool_client: openai.AsyncOpenAI, tool_system: System, redis_client: aioredis.Redis
) -> None:
    """The call and its result given back as input items become the assistant's tool call and a tool
    message of the job's chat; the script's answer after a tool's result is the Response's text."""
    history: Any = [
        {"role": "user", "content": QUESTION},
        {
            "type": "function_call",
            "call_id": "call_1",
            "name": "get_weather",
            "arguments": json.dumps(ARGUMENTS),
        },
        {"type": "function_call_output", "call_id": "call_1", "output": "sunny"},
    ]
    response = await tool_client.responses.create(
        model=tool_system.settings.model_name, input=history, tools=[WEATHER]
    )
    assert response.status == "completed" and response.output_text == ANSWER
    request = json.loads(
        await redis_client.hget(tool_system.keys.job(response.id.removeprefix("resp_")), "request")
    )
    assert request["messages"] == [
        {"role": "user", "content": QUESTION},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": json.dumps(ARGUMENTS)},
                }
            ],
        },
        {"role": "tool", "content": "sunny", "tool_call_id": "call_1"},
    ]
    assert request["tools"][0]["function"]["name"] == "get_weather"
    items = await tool_client.responses.input_items.list(response.id, order="asc")
    assert [item.type for item in items.data] == ["message", "function_call", "function_call_output"]


async def test_previous_response_id_carries_the_call_over_to_its_output(
    tool_client: openai.AsyncOpenAI, tool_system: System, redis_client: aioredis.Redis
) -> None:
    """A call answered in the next turn by `previous_response_id` and a `function_call_output`: the
    conversation the worker renders holds the call, then its result, then the answer."""
    model = tool_system.settings.model_name
    first = await tool_client.responses.create(model=model, input=QUESTION, tools=[WEATHER])
    [call] = [item for item in first.output if item.type == "function_call"]
    second = await tool_client.responses.create(
        model=model,
        previous_response_id=first.id,
        input=[{"type": "function_call_output", "call_id": call.call_id, "output": "sunny"}],
        tools=[WEATHER],
    )
    assert second.output_text == ANSWER and [item.type for item in second.output] == ["reasoning", "message"]
    store = JobStore(redis_client, tool_system.keys, tool_system.settings)
    conversation = await store.conversation(second.id.removeprefix("resp_"))
    assert [(message.role, message.tool_call_id) for message in conversation] == [
        ("user", None),
        ("assistant", None),
        ("tool", call.call_id),
        ("assistant", None),
    ]
    [carried] = conversation[1].tool_calls or []
    assert (carried.id, carried.function.name) == (call.call_id, "get_weather")
    assert json.loads(carried.function.arguments) == ARGUMENTS


async def test_an_agent_streamed_on_the_responses_api_calls_its_tool_and_answers(
    tool_client: openai.AsyncOpenAI, tool_system: System
) -> None:
    """The scripted output stands in for a model that thinks and calls a tool: the OpenAI Agents SDK's
    streamed run reads the reasoning, function_call and message items from the events, the reasoning
    events of the specification's names among them, to the final answer."""
    model = OpenAIResponsesModel(model=tool_system.settings.model_name, openai_client=tool_client)
    agent, cities = weather_agent(model)
    run = Runner.run_streamed(agent, QUESTION)
    async for _ in run.stream_events():
        pass
    assert run.final_output == ANSWER and cities == ["Paris"]
