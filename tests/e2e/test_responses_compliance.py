"""The Open Responses compliance suite's text tests (basic response, streaming response, system prompt,
multi-turn) and a conversation by `previous_response_id`, sent as the suite sends them (plain HTTP
through the gateway) to the session's synthetic system, with the specification's published models as
the validator (tests/open_responses.py): every Response object and every streamed event. Each runs
as the suite sends it, in background mode (created `queued`, then polled or streamed), and streamed in
the background, dropped and resumed with `starting_after`.

The synthetic engine's answers end only at `max_output_tokens` (`incomplete`) or a stop: each request
carries a stop string, so that its answer ends early and `completed`, as a model's end-of-sequence
token ends it; the stop string stays in the text, which is never empty. The suite's basic request on
the real engine, streamed, is in test_openai_client.py.

The suite's tool-calling tests run on a pool of their own, started with vLLM's hermes tool-call parser
and qwen3 reasoning parser on the synthetic engine with a script: the default model cannot write
`<think>` nor `<tool_call>`, so the scripted output stands in for a model that thinks, then calls the
suite's `get_weather`; its reasoning and function_call items and their events are validated too.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import httpx
import openresponses_types as spec
import pytest
from httpx_sse import aconnect_sse

from tests.conftest import System
from tests.helpers import JOB_DEADLINE_SECONDS, eventually
from tests.open_responses import TEXT_TESTS, suite_request, valid_events, valid_response
from tests.scripted_pool import ARGUMENTS

MODES = ("as-sent", "background", "resumed")
TERMINAL = {"completed", "incomplete", "cancelled", "failed"}
ENDS_EARLY = {"stop": ["e"], "include_stop_str_in_output": True}
RESUMED_AFTER = 6  # created, queued, in_progress, output_item.added, content_part.added, a first delta
CONVERSATION = [
    [{"type": "message", "role": "user", "content": "My name is Alice."}],
    [{"type": "message", "role": "user", "content": "What is my name?"}],
]


@pytest.fixture(scope="module")
def system(synthetic_system: System) -> System:
    return synthetic_system


@pytest.fixture
async def http(system: System) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=system.base_url, timeout=JOB_DEADLINE_SECONDS) as client:
        yield client


async def _events(
    http: httpx.AsyncClient, method: str, url: str, stop_after: int | None = None, **request: Any
) -> list[dict[str, Any]]:
    """The stream's events (its first `stop_after`, when given: then the client drops it)."""
    events: list[dict[str, Any]] = []
    async with asyncio.timeout(JOB_DEADLINE_SECONDS), aconnect_sse(http, method, url, **request) as source:
        assert source.response.status_code == 200, await source.response.aread()
        async for sse in source.aiter_sse():
            if sse.data:  # not a keep-alive comment
                events.append(json.loads(sse.data))
                assert sse.event == events[-1]["type"]
                if len(events) == stop_after:
                    break
    return events


async def _polled_to_its_end(http: httpx.AsyncClient, created: dict[str, Any]) -> spec.ResponseResource:
    """The response as polled until it ends, every answer validated on the way."""

    async def poll() -> spec.ResponseResource:
        answer = await http.get(f"/v1/responses/{created['id']}")
        assert answer.status_code == 200, answer.text
        return valid_response(answer.json())

    return await eventually(
        poll, f"response {created['id']} ends", JOB_DEADLINE_SECONDS, until=lambda r: r.status in TERMINAL
    )


async def _answered(
    http: httpx.AsyncClient, body: dict[str, Any], mode: str, ends: dict[str, Any] = ENDS_EARLY
) -> spec.ResponseResource:
    """The final Response of `body` (with `ends`) sent in `mode`, every object and event of the way
    validated."""
    body = body | ends
    if mode == "as-sent" and body["stream"]:
        return valid_events(await _events(http, "POST", "/v1/responses", json=body))
    if mode == "as-sent":
        answer = await http.post("/v1/responses", json=body)
        assert answer.status_code == 200, answer.text
        return valid_response(answer.json())
    if mode == "background" and not body["stream"]:
        answer = await http.post("/v1/responses", json=body | {"background": True})
        assert answer.status_code == 200, answer.text
        assert valid_response(answer.json()).status == "queued"
        return await _polled_to_its_end(http, answer.json())
    background = body | {"background": True, "stream": True}
    if mode == "background":
        return valid_events(await _events(http, "POST", "/v1/responses", json=background))
    first = await _events(http, "POST", "/v1/responses", RESUMED_AFTER, json=background)
    rest = await _events(
        http,
        "GET",
        f"/v1/responses/{first[0]['response']['id']}",
        params={"stream": "true", "starting_after": first[-1]["sequence_number"]},
    )
    assert rest[0]["sequence_number"] == first[-1]["sequence_number"] + 1
    return valid_events(first + rest)


def _check(response: spec.ResponseResource, body: dict[str, Any]) -> None:
    """The suite's own checks (`hasOutput`, `completedStatus`), and the values the job used."""
    assert response.status == "completed" and response.output, response
    message = response.output[0]
    assert isinstance(message, spec.Message) and isinstance(message.content[0], spec.OutputTextContent)
    assert message.content[0].text
    assert (response.model, response.temperature, response.top_p) == (body["model"], 1.0, 1.0)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("test", TEXT_TESTS)
async def test_a_text_test_of_the_suite_validates_and_completes(
    http: httpx.AsyncClient, system: System, test: str, mode: str
) -> None:
    body = suite_request(test, system.settings.model_name)
    _check(await _answered(http, body, mode), body)


@pytest.mark.parametrize("mode", MODES)
async def test_a_conversation_by_previous_response_id_validates_and_completes(
    http: httpx.AsyncClient, system: System, mode: str
) -> None:
    bodies = [{"model": system.settings.model_name, "input": turn, "stream": False} for turn in CONVERSATION]
    first = await _answered(http, bodies[0], mode)
    second = await _answered(http, bodies[1] | {"previous_response_id": first.id}, mode)
    _check(first, bodies[0])
    _check(second, bodies[1])
    assert (first.previous_response_id, second.previous_response_id) == (None, first.id)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("test", ["tool-calling", "tool-calling-streaming"])
async def test_a_tool_calling_test_of_the_suite_validates_and_calls_the_tool(
    tool_system: System, test: str, mode: str
) -> None:
    """The scripted output (tests/scripted_pool.py) stands in for a model that thinks and calls the
    suite's tool in hermes' syntax: the suite's check (a `function_call` item) holds, after the
    reasoning item."""
    body = suite_request(test, tool_system.settings.model_name)
    async with httpx.AsyncClient(base_url=tool_system.base_url, timeout=JOB_DEADLINE_SECONDS) as http:
        response = await _answered(http, body, mode, ends={})
    assert response.status == "completed"
    reasoning, call = response.output
    assert isinstance(reasoning, spec.ReasoningBody) and isinstance(call, spec.FunctionCall)
    assert (call.name, json.loads(call.arguments)) == ("get_weather", ARGUMENTS)
    assert response.tools[0].root.name == "get_weather"
