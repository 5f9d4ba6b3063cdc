"""Tool choices on the real engine, through the `openai` package: `required` and a named function hold
the default model to the tools' JSON schemas, as vLLM's server does (its `pythonic` parser, which the
`system` fixture's pool is started with, takes them as JSON), and the answer carries the calls."""

from __future__ import annotations

import json
from typing import Any

import openai

from tests.conftest import System
from tests.helpers import job_record

CITIES = ["Paris", "London", "Tokyo"]
WEATHER_TOOL: Any = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "enum": CITIES}},
            "required": ["city"],
            "additionalProperties": False,
        },
    },
}
QUESTION: Any = [{"role": "user", "content": "What is the weather in Paris?"}]


def test_a_named_tool_choice_answers_a_call_of_that_function_with_arguments_of_its_schema(
    sync_openai: openai.OpenAI,
) -> None:
    completion = sync_openai.chat.completions.create(
        model=sync_openai.models.list().data[0].id,
        messages=QUESTION,
        tools=[WEATHER_TOOL],
        tool_choice={"type": "function", "function": {"name": "get_weather"}},
        temperature=0,
        max_tokens=40,
    )
    choice = completion.choices[0]
    assert choice.finish_reason == "stop"  # vLLM's, for a named choice
    (call,) = choice.message.tool_calls or []
    assert call.type == "function" and call.id
    assert call.function.name == "get_weather"  # type: ignore[union-attr]
    assert json.loads(call.function.arguments)["city"] in CITIES  # type: ignore[union-attr]


def test_a_required_tool_choice_streams_its_calls_in_parts_the_client_adds_up(
    system: System, sync_openai: openai.OpenAI
) -> None:
    stream = sync_openai.chat.completions.create(
        model=sync_openai.models.list().data[0].id,
        messages=QUESTION,
        tools=[WEATHER_TOOL],
        tool_choice="required",
        parallel_tool_calls=False,
        temperature=0,
        max_tokens=60,
        stream=True,
    )
    names: dict[int, str] = {}
    arguments: dict[int, str] = {}
    reasons, job_id = [], None
    for chunk in stream:
        job_id = chunk.id.removeprefix("chatcmpl-")
        for choice in chunk.choices:
            for part in choice.delta.tool_calls or []:
                if part.function and part.function.name:
                    names[part.index] = part.function.name
                arguments[part.index] = arguments.get(part.index, "") + (
                    (part.function.arguments or "") if part.function else ""
                )
            if choice.finish_reason:
                reasons.append(choice.finish_reason)
    assert reasons == ["tool_calls"]
    assert names == {0: "get_weather"}
    assert json.loads(arguments[0])["city"] in CITIES
    # The job's record counts every token the calls took.
    assert job_id is not None and job_record(system.base_url, job_id)["usage"]["completion_tokens"] > 0
