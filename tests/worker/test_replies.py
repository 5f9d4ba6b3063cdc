"""A chat's output through vLLM's own parsers (worker/replies.py), on the default model's tokenizer.

The default model emits no parser's syntax: these tests feed the parsers the text such a model would
emit, token by token, as the engine hands it over."""

from __future__ import annotations

import json
import warnings
from collections.abc import Iterator
from typing import Any

import pytest

from shared.config import DEFAULT_MODEL_DIR, WorkerSettings
from shared.events import ToolCallDelta
from shared.requests import JobRequest
from worker.chunker import Chunker, joined_calls
from worker.engine import EngineDelta

WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}
THOUGHT_AND_CALL = (
    '<think>I should look it up.</think><tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}'
    "\n</tool_call>"
)


@pytest.fixture(scope="module")
def tokenizer() -> Any:
    """vLLM's tokenizer of the default model; importing vLLM raises torch's deprecation warnings, which
    pytest would turn into failures."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        from vllm.tokenizers import get_tokenizer

        import worker.replies  # noqa: F401

        return get_tokenizer(str(DEFAULT_MODEL_DIR))


def parsing(tokenizer: Any, **flags: object) -> Any:
    from worker.replies import ReplyParsing

    return ReplyParsing(WorkerSettings(model=DEFAULT_MODEL_DIR, **flags), tokenizer)  # type: ignore[arg-type]


def chat(**options: object) -> JobRequest:
    return JobRequest.model_validate(
        {
            "messages": [{"role": "user", "content": "The weather in Paris?"}],
            "tools": [WEATHER_TOOL],
            **options,
        }
    )


def deltas(tokenizer: Any, text: str) -> Iterator[EngineDelta]:
    """The text as the engine hands it over: a token a step, the last one ending the choice."""
    ids = tokenizer.encode(text, add_special_tokens=False)
    for number, token_id in enumerate(ids):
        last = number == len(ids) - 1
        yield EngineDelta(
            text=tokenizer.decode([token_id]),
            token_ids=[token_id],
            finished=last,
            finish_reason="stop" if last else None,
        )


def calls_of(parsed: list[EngineDelta]) -> list[ToolCallDelta]:
    return joined_calls([call for delta in parsed for call in delta.tool_calls or []]) or []


def test_reasoning_and_a_tool_call_are_parted_from_the_content_and_the_choice_ends_with_tool_calls(
    tokenizer: Any,
) -> None:
    replies = parsing(
        tokenizer, enable_auto_tool_choice=True, tool_call_parser="hermes", reasoning_parser="qwen3"
    )
    reply = replies.reply(chat(), [1, 2, 3])
    parsed = [reply.parse(delta) for delta in deltas(tokenizer, THOUGHT_AND_CALL)]
    assert "".join(delta.reasoning for delta in parsed) == "I should look it up."
    assert "".join(delta.text for delta in parsed).strip() == ""
    (call,) = calls_of(parsed)
    assert call.function.name == "get_weather" and call.id and call.type == "function"
    assert json.loads(call.function.arguments) == {"city": "Paris"}
    assert parsed[-1].finished and parsed[-1].finish_reason == "tool_calls"
    # Every token is still there, whatever it became.
    ids = [token_id for delta in parsed for token_id in delta.token_ids]
    assert ids == tokenizer.encode(THOUGHT_AND_CALL, add_special_tokens=False)


def test_a_chat_without_tools_keeps_its_text_as_content(tokenizer: Any) -> None:
    replies = parsing(tokenizer, enable_auto_tool_choice=True, tool_call_parser="hermes")
    request = JobRequest.model_validate({"messages": [{"role": "user", "content": "hi"}]})
    reply = replies.reply(request, [1])
    parsed = [reply.parse(delta) for delta in deltas(tokenizer, "Hello there, friend.")]
    assert "".join(delta.text for delta in parsed) == "Hello there, friend."
    assert parsed[-1].finish_reason == "stop"
    assert not any(delta.tool_calls or delta.reasoning for delta in parsed)


def test_a_named_choice_is_held_to_its_function_s_parameters_and_ends_with_stop(tokenizer: Any) -> None:
    """As vLLM: the named function's parameters become the constraint; the output is its arguments."""
    replies = parsing(tokenizer, enable_auto_tool_choice=True, tool_call_parser="pythonic")
    reply = replies.reply(chat(tool_choice={"type": "function", "function": {"name": "get_weather"}}), [1])
    constraint = reply.engine_options["structured_outputs"]
    assert constraint.json == WEATHER_TOOL["function"]["parameters"]  # type: ignore[index]
    parsed = [reply.parse(delta) for delta in deltas(tokenizer, '{"city": "Paris"}')]
    (call,) = calls_of(parsed)
    assert call.function.name == "get_weather"
    assert json.loads(call.function.arguments) == {"city": "Paris"}
    assert parsed[-1].finish_reason == "stop"


def test_a_required_choice_is_held_to_a_list_of_calls_and_ends_with_tool_calls(tokenizer: Any) -> None:
    replies = parsing(tokenizer, enable_auto_tool_choice=True, tool_call_parser="pythonic")
    reply = replies.reply(chat(tool_choice="required", parallel_tool_calls=False), [1])
    schema = reply.engine_options["structured_outputs"].json
    assert schema["type"] == "array" and schema["maxItems"] == 1
    output = '[{"name": "get_weather", "parameters": {"city": "Paris"}}]'
    parsed = [reply.parse(delta) for delta in deltas(tokenizer, output)]
    (call,) = calls_of(parsed)
    assert (call.function.name, json.loads(call.function.arguments)) == ("get_weather", {"city": "Paris"})
    assert parsed[-1].finish_reason == "tool_calls"


def test_a_resumed_run_goes_on_with_the_call_where_the_run_before_stopped(tokenizer: Any) -> None:
    """A worker that takes a job over mid-call: the parts before and after add up to the one call."""
    flags = {"enable_auto_tool_choice": True, "tool_call_parser": "hermes", "reasoning_parser": "qwen3"}
    steps = list(deltas(tokenizer, THOUGHT_AND_CALL))
    split = len(steps) * 3 // 4  # inside the call's arguments
    first = parsing(tokenizer, **flags).reply(chat(), [1])
    before = [first.parse(delta) for delta in steps[:split]]
    second = parsing(tokenizer, **flags).reply(chat(), [1])
    second.resumed([token_id for delta in steps[:split] for token_id in delta.token_ids])
    after = [second.parse(delta) for delta in steps[split:]]
    (call,) = calls_of(before + after)
    assert json.loads(call.function.arguments) == {"city": "Paris"}
    assert after[-1].finish_reason == "tool_calls"


def test_the_chunker_joins_a_call_s_parts_into_one_delta_event() -> None:
    chunker = Chunker(stream_step=4, prompt_tokens=1, next_seq=0)
    name = ToolCallDelta.model_validate(
        {"index": 0, "id": "call-1", "type": "function", "function": {"name": "f"}}
    )
    parts = [name] + [
        ToolCallDelta.model_validate({"index": 0, "function": {"arguments": fragment}})
        for fragment in ('{"a"', ": 1}")
    ]
    events = []
    for number, part in enumerate(parts):
        events += chunker.feed(EngineDelta(text="", token_ids=[number], reasoning="r", tool_calls=[part]))
    events += chunker.flush()
    (event,) = events
    assert event.tool_calls is not None and event.reasoning == "rrr"  # type: ignore[union-attr]
    (call,) = event.tool_calls  # type: ignore[union-attr]
    assert (call.id, call.function.name, call.function.arguments) == ("call-1", "f", '{"a": 1}')


def test_the_prompt_s_logprobs_go_with_the_first_delta_event_only() -> None:
    from shared.events import TokenLogprob

    prompt = [None, TokenLogprob(token_id=5, token="a", logprob=-1.0)]
    chunker = Chunker(stream_step=2, prompt_tokens=2, next_seq=0)
    events = chunker.feed(EngineDelta(text="x", token_ids=[1], prompt_logprobs=prompt))
    events += chunker.feed(EngineDelta(text="y", token_ids=[2]))
    events += chunker.feed(EngineDelta(text="z", token_ids=[3], finished=True, finish_reason="stop"))
    first, second = events
    assert first.prompt_logprobs == prompt  # type: ignore[union-attr]
    assert second.prompt_logprobs is None  # type: ignore[union-attr]


def test_hidden_reasoning_leaves_the_content_alone_and_hides_the_tokens_logprobs(tokenizer: Any) -> None:
    """As vLLM: `include_reasoning: false` drops the reasoning, and the logprobs that would show it."""
    from shared.events import TokenLogprob

    flags = {"enable_auto_tool_choice": True, "tool_call_parser": "hermes", "reasoning_parser": "qwen3"}
    reply = parsing(tokenizer, **flags).reply(chat(include_reasoning=False), [1])
    parsed = []
    for delta in deltas(tokenizer, "<think>Hmm.</think>Sunny."):
        delta.logprobs = [TokenLogprob(token_id=delta.token_ids[0], token="t", logprob=-0.5)]
        parsed.append(reply.parse(delta))
    assert "".join(delta.text for delta in parsed) == "Sunny."
    assert not any(delta.reasoning or delta.logprobs for delta in parsed)
