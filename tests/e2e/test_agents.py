"""Agents through the queue, with the clients people run: the `openai` package's streaming helper, the
OpenAI Agents SDK and LangChain's `bind_tools` get the tool calls and the reasoning as from vLLM's server.

The workers run the synthetic engine with a script: the default model cannot write the hermes parser's
`<tool_call>` nor qwen3's `<think>`, so the scripted output stands in for a model that does, and vLLM's
own parsers run on it through the whole path (worker, stream, relay, each API's framing). A chat whose
last message is a tool's result gets the script's second part: the agent's answer.
"""

from __future__ import annotations

import functools
import json
import operator
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import openai
import pytest
from agents import (
    OpenAIChatCompletionsModel,
    OpenAIResponsesModel,
    Runner,
)
from langchain_core.messages import AIMessage, AIMessageChunk
from langchain_openai import ChatOpenAI

from shared.config import DEFAULT_MODEL_DIR
from tests.conftest import System
from tests.faults.conftest import Pool, assert_one_seamless_stream, run_pool, wait_for_tokens
from tests.helpers import read_sse, submit
from tests.scripted_pool import ANSWER, ARGUMENTS, REASONING, SCRIPTED_POOL
from tests.weather_agent import weather_agent

MODEL = DEFAULT_MODEL_DIR.name
WEATHER_TOOL: Any = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}
QUESTION: Any = [{"role": "user", "content": "What is the weather in Paris?"}]
TIMEOUT = 60


@pytest.fixture(scope="module")
def agents_pool(redis_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pool]:
    """The same pool as workers a test may kill (tests/faults' short leases), stepping slowly enough
    that a worker dies in the middle of the call."""
    if not DEFAULT_MODEL_DIR.is_dir():
        pytest.skip("the default model is not prepared (make setup)")
    yield from run_pool(redis_url, tmp_path_factory, synthetic_step_seconds=0.1, **SCRIPTED_POOL)


@pytest.fixture
def sync_openai(tool_system: System) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(
        base_url=f"{tool_system.base_url}/v1", api_key="none", max_retries=0, timeout=TIMEOUT
    ) as client:
        yield client


@pytest.fixture
async def async_openai(tool_system: System) -> AsyncIterator[openai.AsyncOpenAI]:
    async with openai.AsyncOpenAI(
        base_url=f"{tool_system.base_url}/v1", api_key="none", max_retries=0, timeout=TIMEOUT
    ) as client:
        yield client


def test_the_openai_stream_helper_accumulates_the_tool_call_and_the_reasoning(
    sync_openai: openai.OpenAI,
) -> None:
    """The scripted output stands in for a model that writes `<think>` and hermes' `<tool_call>`: the
    streaming helper puts the deltas together into the call, apart from the reasoning, as the whole
    answer has them."""
    with sync_openai.chat.completions.stream(model=MODEL, messages=QUESTION, tools=[WEATHER_TOOL]) as stream:
        events = list(stream)
        streamed = stream.get_final_completion()
    whole = sync_openai.chat.completions.create(model=MODEL, messages=QUESTION, tools=[WEATHER_TOOL])
    assert any(event.type == "tool_calls.function.arguments.done" for event in events)
    for answer in (streamed, whole):
        choice = answer.choices[0]
        assert choice.finish_reason == "tool_calls"
        [call] = choice.message.tool_calls or []
        assert call.type == "function" and call.id
        assert call.function.name == "get_weather" and json.loads(call.function.arguments) == ARGUMENTS
        assert (choice.message.model_extra or {}).get("reasoning") == REASONING
        assert not choice.message.content


async def test_an_agent_calls_its_function_tool_and_answers_through_chat_completions(
    async_openai: openai.AsyncOpenAI,
) -> None:
    """The scripted output stands in for a model that calls tools in hermes' syntax: the OpenAI Agents
    SDK's agent calls `get_weather` with the script's arguments, and its second turn (after the tool's
    result) is the final answer, whether the run streams or not."""
    agent, cities = weather_agent(OpenAIChatCompletionsModel(model=MODEL, openai_client=async_openai))
    result = await Runner.run(agent, "What is the weather in Paris?")
    assert result.final_output == ANSWER and cities == ["Paris"]
    streamed = Runner.run_streamed(agent, "What is the weather in Paris?")
    async for _ in streamed.stream_events():
        pass
    assert streamed.final_output == ANSWER and cities == ["Paris", "Paris"]


async def test_an_agent_calls_its_function_tool_and_answers_through_the_responses_api(
    async_openai: openai.AsyncOpenAI,
) -> None:
    """The scripted output stands in for a model that calls tools in hermes' syntax: the same agent on
    the Responses API (`function_call` and `function_call_output` items) to its final answer."""
    agent, cities = weather_agent(OpenAIResponsesModel(model=MODEL, openai_client=async_openai))
    result = await Runner.run(agent, "What is the weather in Paris?")
    assert result.final_output == ANSWER and cities == ["Paris"]


def test_langchain_bind_tools_gets_the_tool_call(tool_system: System) -> None:
    """The scripted output stands in for a model that calls tools in hermes' syntax: LangChain's
    `ChatOpenAI.bind_tools` reads the call, whole and streamed."""
    chat = ChatOpenAI(
        model=MODEL, base_url=f"{tool_system.base_url}/v1", api_key="none", max_retries=0, timeout=TIMEOUT
    ).bind_tools([WEATHER_TOOL])
    message = chat.invoke("What is the weather in Paris?")
    assert isinstance(message, AIMessage)
    [call] = message.tool_calls
    assert call["name"] == "get_weather" and call["args"] == ARGUMENTS and call["id"]
    chunks = [
        chunk for chunk in chat.stream("What is the weather in Paris?") if isinstance(chunk, AIMessageChunk)
    ]
    [call] = functools.reduce(operator.add, chunks).tool_calls
    assert call["name"] == "get_weather" and call["args"] == ARGUMENTS


async def test_the_job_s_events_replay_the_tool_call_and_the_reasoning(
    tool_system: System, async_openai: openai.AsyncOpenAI
) -> None:
    """The scripted output stands in for a model that thinks and calls tools: the job's native events,
    read again after the answer, carry the same reasoning and tool-call parts the chunks carried, and a
    reader resuming in the middle of the call gets the rest of its parts."""
    chunks = [
        chunk
        async for chunk in await async_openai.chat.completions.create(
            model=MODEL, messages=QUESTION, tools=[WEATHER_TOOL], stream=True
        )
    ]
    job_id = chunks[0].id.removeprefix("chatcmpl-")
    async with httpx.AsyncClient(base_url=tool_system.base_url, timeout=TIMEOUT) as http:
        replayed = await read_sse(http, job_id)
        first_call = next(n for n, (_, event) in enumerate(replayed) if event.get("tool_calls"))
        resumed = await read_sse(http, job_id, last_event_id=replayed[first_call][0])
    assert resumed == replayed[first_call + 1 :]
    events = [event for _, event in replayed]
    deltas = [event for event in events if event["type"] == "delta"]
    assert "".join(event.get("reasoning", "") for event in deltas) == REASONING
    streamed_parts = [
        part.model_dump(exclude_none=True)
        for chunk in chunks
        for part in chunk.choices[0].delta.tool_calls or []
    ]
    replayed_parts = [part for event in deltas for part in event.get("tool_calls") or []]
    assert replayed_parts == streamed_parts and replayed_parts[0]["function"]["name"] == "get_weather"
    arguments = "".join(part["function"].get("arguments", "") for part in replayed_parts)
    assert json.loads(arguments) == ARGUMENTS
    assert events[-1]["type"] == "done" and events[-1]["finish_reason"] == "tool_calls"


async def test_a_call_whose_worker_dies_midway_is_written_once_by_the_next(agents_pool: Pool) -> None:
    """The scripted output stands in for a model that thinks and calls tools: its worker is killed in
    the middle of the call's arguments, another worker resumes the job from the tokens in its stream,
    and the stream holds the reasoning and one whole call, once, as one seamless stream."""
    agents_pool.ensure_workers()
    async with httpx.AsyncClient(base_url=agents_pool.base_url, timeout=TIMEOUT) as http:
        job_id = await submit(http, messages=QUESTION, tools=[WEATHER_TOOL], max_tokens=200)
        running = await wait_for_tokens(http, job_id, 32)  # past the call's name, in its arguments
        agents_pool.processes.kill(agents_pool.worker_named(running["worker"]))
        events = [event for _, event in await read_sse(http, job_id)]
    assert_one_seamless_stream(events)
    assert [event["attempt"] for event in events if event.get("state") == "running"] == [1, 2]
    deltas = [event for event in events if event["type"] == "delta"]
    assert "".join(event.get("reasoning", "") for event in deltas) == REASONING
    parts = [part for event in deltas for part in event.get("tool_calls") or []]
    assert [part["function"].get("name") for part in parts if part.get("id")] == ["get_weather"]
    assert json.loads("".join(part["function"].get("arguments", "") for part in parts)) == ARGUMENTS
    assert events[-1]["type"] == "done" and events[-1]["finish_reason"] == "tool_calls"
