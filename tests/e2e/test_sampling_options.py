"""vLLM's sampling options change real output as they do on vLLM's own server.

Each test sets one option and shows its effect on the session's engines: through the `openai`
package where the option is an OpenAI one (vLLM's own go in `extra_body`, as vLLM documents),
through the native API where token ids must be read.
"""

from __future__ import annotations

import asyncio
import json
import re
from typing import Any

import httpx
import jsonschema
import openai
import pytest
from openai.types.chat import ChatCompletionMessageParam

from tests.conftest import System
from tests.helpers import (
    DEFAULT_DEADLINE_SECONDS,
    poll_all,
    streamed_token_ids,
    submit,
    wait_for_status,
)

SHORT_ANSWER: list[ChatCompletionMessageParam] = [
    {"role": "user", "content": "What is the capital of France? Answer in one word."}
]
REPETITIVE = "one two one two one two one two one two"
STORY = "Once upon a time, in a small village,"
END_OF_TURN = "<|im_end|>"  # SmolLM2's end-of-sequence token, as text


async def _chat(client: openai.AsyncOpenAI, system: System, **options: Any) -> Any:
    return await client.chat.completions.create(
        model=system.settings.model_name, messages=SHORT_ANSWER, temperature=0, **options
    )


async def _complete(client: openai.AsyncOpenAI, system: System, prompt: str, **options: Any) -> Any:
    return await client.completions.create(model=system.settings.model_name, prompt=prompt, **options)


async def _native(client: httpx.AsyncClient, **body: Any) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """A native job run to its end: its record and its events."""
    job_id = await submit(client, **body)
    events = await poll_all(client, job_id)
    return await wait_for_status(client, job_id, {"completed"}), events


async def test_ignore_eos_yields_exactly_max_tokens(async_openai: openai.AsyncOpenAI, system: System) -> None:
    plain = await _chat(async_openai, system, max_tokens=40)
    assert plain.choices[0].finish_reason == "stop" and plain.usage.completion_tokens < 40
    forced = await _chat(async_openai, system, max_tokens=40, extra_body={"ignore_eos": True})
    assert forced.choices[0].finish_reason == "length"
    assert forced.usage.completion_tokens == 40


async def test_min_tokens_forbids_an_early_stop(async_openai: openai.AsyncOpenAI, system: System) -> None:
    answer = await _chat(async_openai, system, max_tokens=40, extra_body={"min_tokens": 25})
    assert answer.usage.completion_tokens >= 25


async def test_skip_special_tokens_false_shows_the_end_token(
    async_openai: openai.AsyncOpenAI, system: System
) -> None:
    # Past its end-of-sequence token (sampled within 40 tokens, as the ignore_eos test shows).
    hidden = await _chat(async_openai, system, max_tokens=40, extra_body={"ignore_eos": True})
    shown = await _chat(
        async_openai, system, max_tokens=40, extra_body={"ignore_eos": True, "skip_special_tokens": False}
    )
    assert END_OF_TURN not in hidden.choices[0].message.content
    assert END_OF_TURN in shown.choices[0].message.content


async def test_logit_bias_of_100_forces_its_token(
    client: httpx.AsyncClient, async_openai: openai.AsyncOpenAI, system: System
) -> None:
    _, events = await _native(client, prompt=STORY, max_tokens=4, temperature=0)
    token = streamed_token_ids(events)[1]
    _, events = await _native(client, prompt=STORY, max_tokens=6, temperature=0, logit_bias={str(token): 100})
    assert streamed_token_ids(events) == [token] * 6
    answer = await _complete(
        async_openai, system, STORY, max_tokens=6, temperature=0, logit_bias={str(token): 100}, logprobs=0
    )
    assert len(set(answer.choices[0].logprobs.tokens)) == 1


@pytest.mark.parametrize(
    "penalty", [{"repetition_penalty": 1.8}, {"presence_penalty": 2.0}, {"frequency_penalty": 2.0}]
)
async def test_a_penalty_changes_a_greedy_output(
    async_openai: openai.AsyncOpenAI, system: System, penalty: dict[str, Any]
) -> None:
    plain = await _complete(async_openai, system, REPETITIVE, max_tokens=24, temperature=0)
    penalised = await _complete(
        async_openai, system, REPETITIVE, max_tokens=24, temperature=0, extra_body=penalty
    )
    assert penalised.choices[0].text != plain.choices[0].text


async def test_min_p_of_one_leaves_only_the_likeliest_token(client: httpx.AsyncClient) -> None:
    async def shortfalls(**options: Any) -> list[float]:
        """Per sampled token, how much less likely it was than the likeliest one."""
        _, events = await _native(
            client, prompt=STORY, max_tokens=24, temperature=2.0, seed=5, logprobs=1, **options
        )
        logprobs = [lp for event in events if event["type"] == "delta" for lp in event["logprobs"]]
        return [lp["top_logprobs"][0]["logprob"] - lp["logprob"] for lp in logprobs]

    assert max(await shortfalls()) > 1.0  # hot sampling picks unlikely tokens
    # Only the likeliest (up to a near-tie the engine's numerics may break either way).
    assert max(await shortfalls(min_p=1.0)) < 0.05


async def test_stop_token_ids_stop_at_the_token(client: httpx.AsyncClient) -> None:
    whole, events = await _native(client, prompt=STORY, max_tokens=12, temperature=0, ignore_eos=True)
    tokens = streamed_token_ids(events)
    # A native job takes vLLM's options as the OpenAI routes pass them on: ignore_eos runs to max_tokens.
    assert (whole["finish_reason"], whole["usage"]["completion_tokens"], len(tokens)) == ("length", 12, 12)
    stop_at = next(index for index in range(3, 12) if tokens[index] not in tokens[:index])
    job, events = await _native(
        client, prompt=STORY, max_tokens=12, temperature=0, ignore_eos=True, stop_token_ids=[tokens[stop_at]]
    )
    assert job["finish_reason"] == "stop"
    assert streamed_token_ids(events) == tokens[: stop_at + 1]


async def test_include_stop_str_in_output_keeps_the_stop_string(
    async_openai: openai.AsyncOpenAI, system: System
) -> None:
    greedy = (await _complete(async_openai, system, STORY, max_tokens=24, temperature=0)).choices[0].text
    stop = greedy.strip().split()[2]
    cut = await _complete(async_openai, system, STORY, max_tokens=24, temperature=0, stop=[stop])
    kept = await _complete(
        async_openai,
        system,
        STORY,
        max_tokens=24,
        temperature=0,
        stop=[stop],
        extra_body={"include_stop_str_in_output": True},
    )
    assert kept.choices[0].text == cut.choices[0].text + stop
    assert greedy.startswith(kept.choices[0].text)


CITY_SCHEMA = {
    "type": "object",
    "properties": {"city": {"type": "string", "maxLength": 20}, "population": {"type": "integer"}},
    "required": ["city", "population"],
    "additionalProperties": False,
}


async def test_a_json_schema_answer_parses_and_validates(
    async_openai: openai.AsyncOpenAI, system: System
) -> None:
    answer = await _chat(
        async_openai,
        system,
        max_tokens=60,
        response_format={"type": "json_schema", "json_schema": {"name": "city", "schema": CITY_SCHEMA}},
    )
    jsonschema.validate(json.loads(answer.choices[0].message.content), CITY_SCHEMA)


async def test_a_json_object_answer_parses(async_openai: openai.AsyncOpenAI, system: System) -> None:
    question: list[ChatCompletionMessageParam] = [
        {"role": "user", "content": 'Give the capital of France as JSON: {"capital": ...}'}
    ]
    answer = await async_openai.chat.completions.create(
        model=system.settings.model_name,
        messages=question,
        temperature=0,
        max_tokens=100,
        response_format={"type": "json_object"},
    )
    assert answer.choices[0].finish_reason == "stop"
    assert isinstance(json.loads(answer.choices[0].message.content or ""), dict)


async def test_structured_outputs_choice_and_regex_hold_on_native_jobs(client: httpx.AsyncClient) -> None:
    job, _ = await _native(
        client, messages=SHORT_ANSWER, max_tokens=10, structured_outputs={"choice": ["Lyon", "Nice"]}
    )
    assert job["output"]["text"] in ("Lyon", "Nice")
    job, _ = await _native(client, prompt=STORY, max_tokens=10, structured_outputs={"regex": "[0-9]{3}"})
    assert re.fullmatch("[0-9]{3}", job["output"]["text"])


async def test_truncate_prompt_tokens_keeps_the_prompts_last_tokens(
    async_openai: openai.AsyncOpenAI, system: System
) -> None:
    answer = await _complete(
        async_openai, system, STORY, max_tokens=4, temperature=0, extra_body={"truncate_prompt_tokens": 3}
    )
    assert answer.usage.prompt_tokens == 3


async def test_n_gives_that_many_choices_whole_and_streamed(
    async_openai: openai.AsyncOpenAI, system: System
) -> None:
    """Every choice runs to max_tokens (ignore_eos), so usage must be exactly their sum."""
    options: dict[str, Any] = {
        "max_tokens": 8,
        "temperature": 1.0,
        "seed": 7,
        "n": 3,
        "extra_body": {"ignore_eos": True},
    }
    whole = await _complete(async_openai, system, STORY, **options)
    assert [(choice.index, choice.finish_reason) for choice in whole.choices] == [
        (0, "length"),
        (1, "length"),
        (2, "length"),
    ]
    assert len({choice.text for choice in whole.choices}) > 1  # a seed apiece, as vLLM gives each choice
    assert whole.usage.completion_tokens == 3 * 8
    async with asyncio.timeout(DEFAULT_DEADLINE_SECONDS):
        chunks = await async_openai.chat.completions.create(
            model=system.settings.model_name,
            messages=SHORT_ANSWER,
            stream=True,
            stream_options={"include_usage": True},
            **options,
        )
        received = [chunk async for chunk in chunks]
    ends = {c.choices[0].index: c.choices[0].finish_reason for c in received if c.choices}
    assert ends == {0: "length", 1: "length", 2: "length"}
    roles = [c.choices[0].index for c in received if c.choices and c.choices[0].delta.role == "assistant"]
    assert sorted(roles) == [0, 1, 2]
    usage = received[-1].usage
    assert usage is not None and usage.completion_tokens == 3 * 8
