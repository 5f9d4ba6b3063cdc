"""The real engine side by side with vLLM's own server, started with the same engine arguments and
tool flags, through the `openai` package.

Tool choices: `required` and a named function hold the default model to the tools' JSON schemas, as
vLLM's server does (its `pythonic` parser, which the `system` fixture's pool is started with, takes
them as JSON), and the answer carries the calls; greedy answers are the same calls, the same arguments
and the same text.

A completion's `echo` with `logprobs`, as evaluation harnesses send it to score a text (a prompt of
text or token ids, `max_tokens` 0 or 1): the same text, tokens, logprobs, alternatives, offsets and
usage, whole and streamed."""

from __future__ import annotations

import json
import math
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import openai
import pytest

from bench import vllm_server
from bench.system import Child, start
from shared.config import Settings
from tests.conftest import SYSTEM_ENGINE, System, make_settings
from tests.helpers import job_record
from tests.processes import free_port

TOOL_FLAGS = ["--enable-auto-tool-choice", "--tool-call-parser", "pythonic"]

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
    assert call.function.name == "get_weather"
    assert json.loads(call.function.arguments)["city"] in CITIES


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


@dataclass
class Server:
    """vLLM's own OpenAI server, started, and the flags it was started with."""

    port: int
    flags: list[str]
    child: Child


def tool_server_flags(settings: Settings, port: int) -> list[str]:
    with warnings.catch_warnings():  # the flags come from the worker's engine arguments: vLLM's import
        warnings.simplefilter("ignore", DeprecationWarning)
        return [*vllm_server.server_flags(settings, port), *TOOL_FLAGS]


@pytest.fixture(scope="session", autouse=True)
def tool_server(redis_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """vLLM's server on the engine arguments of `system`'s workers (SYSTEM_ENGINE), with their tool
    flags, started as this module's first test sets up: a session fixture that the module uses
    unasked is set up before `system`, so that the three engines start side by side rather than the
    server's after the workers'. `vllm_openai` stops it with the module."""
    port = free_port()
    settings = make_settings(redis_url, **SYSTEM_ENGINE)
    flags = tool_server_flags(settings, port)
    server = Server(
        port,
        flags,
        start("vllm-server", ["bench.vllm_server", *flags], settings, tmp_path_factory.mktemp("vllm")),
    )
    yield server
    if server.child.process.returncode is None:  # not stopped with the module: its tests were deselected
        vllm_server.stop(server.child)


@pytest.fixture(scope="module")
def vllm_openai(system: System, tool_server: Server) -> Iterator[openai.OpenAI]:
    """vLLM's own OpenAI server, once it answers, on the engine arguments the workers give theirs."""
    assert tool_server.flags == tool_server_flags(system.settings, tool_server.port)
    try:
        vllm_server.wait_ready(tool_server.port, tool_server.child)
        with openai.OpenAI(
            base_url=f"http://127.0.0.1:{tool_server.port}/v1", api_key="none", max_retries=0
        ) as client:
            yield client
    finally:
        vllm_server.stop(tool_server.child)


def answer(client: openai.OpenAI, model: str, tool_choice: Any, stream: bool) -> tuple[Any, ...]:
    """A greedy answer's text, calls (name and arguments) and finish reason, streamed (the client adds
    the parts up) or whole."""
    request: Any = {
        "model": model,
        "messages": QUESTION,
        "tools": [WEATHER_TOOL],
        "tool_choice": tool_choice,
        "temperature": 0,
        "max_tokens": 40,
    }
    if not stream:
        choice = client.chat.completions.create(**request).choices[0]
        calls = [(call.function.name, call.function.arguments) for call in choice.message.tool_calls or []]
        return choice.message.content or "", calls, choice.finish_reason
    text, names, arguments, reason = "", {}, {}, None
    for chunk in client.chat.completions.create(**request, stream=True):
        for part in chunk.choices:
            text += part.delta.content or ""
            for call in part.delta.tool_calls or []:
                function = call.function
                if function is not None and function.name:
                    names[call.index] = function.name
                fragment = (function.arguments or "") if function is not None else ""
                arguments[call.index] = arguments.get(call.index, "") + fragment
            reason = part.finish_reason or reason
    return text, [(names[index], arguments[index]) for index in sorted(names)], reason


@pytest.mark.parametrize("stream", [True, False], ids=["streamed", "whole"])
@pytest.mark.parametrize(
    "tool_choice",
    ["required", {"type": "function", "function": {"name": "get_weather"}}, "auto"],
    ids=["required", "named", "auto"],
)
def test_greedy_answers_are_vllm_s_servers_own(
    sync_openai: openai.OpenAI, vllm_openai: openai.OpenAI, tool_choice: Any, stream: bool
) -> None:
    ours = answer(sync_openai, sync_openai.models.list().data[0].id, tool_choice, stream)
    theirs = answer(vllm_openai, vllm_openai.models.list().data[0].id, tool_choice, stream)
    assert ours == theirs
    if tool_choice != "auto":
        assert ours[1], "the constraint holds the model to a call"


ECHOED = "The capital of France is Paris. The capital of Italy is"
SECOND = "Once upon a time, there was a"


def scored(client: openai.OpenAI, prompt: Any, max_tokens: int, stream: bool) -> dict[int, dict[str, Any]]:
    """What a harness reads of a greedy echoed completion with one alternative a token, by choice: its
    text, its tokens with their logprobs, alternatives and offsets, and its finish reason; streamed,
    the chunks' parts end to end. Usage, the whole answer's (streamed, the last chunk's), under -1."""
    request: Any = {
        "model": client.models.list().data[0].id,
        "prompt": prompt,
        "max_tokens": max_tokens,
        "temperature": 0,
        "logprobs": 1,
        "echo": True,
    }
    chunks = (
        list(client.completions.create(**request, stream=True, stream_options={"include_usage": True}))
        if stream
        else [client.completions.create(**request)]
    )
    parts = ("tokens", "token_logprobs", "top_logprobs", "text_offset")
    seen: dict[int, dict[str, Any]] = {}
    for chunk in chunks:
        for choice in chunk.choices:
            mine = seen.setdefault(choice.index, {"text": "", **{part: [] for part in parts}})
            mine["text"] += choice.text
            mine["finish_reason"] = choice.finish_reason or mine.get("finish_reason")
            for part in parts:
                mine[part] += getattr(choice.logprobs, part) if choice.logprobs else []
        if chunk.usage is not None:
            seen[-1] = {"usage": (chunk.usage.prompt_tokens, chunk.usage.completion_tokens)}
    return seen


def close(ours: float | None, theirs: float | None) -> bool:
    """Two engines' logprobs of the same tokens: equal but for the float sums of other batches."""
    if ours is None or theirs is None:
        return ours is theirs
    return math.isclose(ours, theirs, rel_tol=1e-3, abs_tol=1e-2)


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
@pytest.mark.parametrize("max_tokens", [0, 1])
@pytest.mark.parametrize("given", ["text", "token-ids", "texts"])
def test_an_echo_with_logprobs_scores_the_prompt_as_vllm_s_server_does(
    sync_openai: openai.OpenAI, vllm_openai: openai.OpenAI, given: str, max_tokens: int, stream: bool
) -> None:
    prompt: Any = {"text": ECHOED, "texts": [ECHOED, SECOND]}.get(given)
    if given == "token-ids":
        tokenize = f"{str(vllm_openai.base_url).removesuffix('/v1/')}/tokenize"
        prompt = httpx.post(tokenize, json={"prompt": ECHOED}).json()["tokens"]
    ours, theirs = (
        scored(sync_openai, prompt, max_tokens, stream),
        scored(vllm_openai, prompt, max_tokens, stream),
    )
    assert ours.keys() == theirs.keys() == {-1, *range(2 if given == "texts" else 1)}
    assert ours.pop(-1) == theirs.pop(-1)  # usage
    for index, mine in ours.items():
        vllms = theirs[index]
        exact = ("text", "tokens", "text_offset", "finish_reason")
        assert {name: mine[name] for name in exact} == {name: vllms[name] for name in exact}
        assert mine["text"].startswith([ECHOED, SECOND][index]) and mine["token_logprobs"][0] is None
        assert all(map(close, mine["token_logprobs"], vllms["token_logprobs"])), (mine, vllms)
        for top, vllm_top in zip(mine["top_logprobs"], vllms["top_logprobs"], strict=True):
            assert (top is None) == (vllm_top is None)
            if top is not None:
                assert top.keys() == vllm_top.keys() and all(close(top[k], vllm_top[k]) for k in top)
