"""The stored chat completions' pure pieces: what a stored completion's job keeps, the messages as
OpenAI's `ChatCompletionStoreMessage` (the `openai` package's own model), and a listing's filters as
OpenAI's client sends them."""

from __future__ import annotations

import json

import pytest
from openai.types.chat import ChatCompletionStoreMessage

from gateway.compat.openai_bodies import ChatBody, CompletionBody
from gateway.compat.stored_chat import (
    METADATA,
    listed,
    metadata_filter,
    metadata_of,
    store_messages,
    stored_annotations,
)
from shared.chat import ChatMessage, FunctionCall, ToolCall
from shared.errors import InvalidRequest

HI = [{"role": "user", "content": "hi"}]


def test_only_a_chat_completion_with_store_keeps_its_metadata() -> None:
    stored = ChatBody.model_validate({"model": "m", "messages": HI, "store": True, "metadata": {"a": "b"}})
    assert metadata_of(stored_annotations(stored)) == {"a": "b"}
    bare = ChatBody.model_validate({"model": "m", "messages": HI, "store": True})
    assert stored_annotations(bare) == {METADATA: json.dumps({})}
    for kept_not in (
        ChatBody.model_validate({"model": "m", "messages": HI, "metadata": {"a": "b"}}),
        CompletionBody.model_validate({"model": "m", "prompt": "hi", "store": True, "metadata": {"a": "b"}}),
    ):
        assert stored_annotations(kept_not) == {}
    assert metadata_of({}) is None


def test_messages_are_openais_store_messages_each_with_an_id_of_its_own() -> None:
    call = ToolCall(id="call_1", function=FunctionCall(name="get_weather", arguments='{"city": "Paris"}'))
    messages = [
        ChatMessage(role="system", content="Be brief."),
        ChatMessage(role="user", content="Weather?", name="ann"),
        ChatMessage(role="assistant", tool_calls=[call]),
        ChatMessage(role="tool", content="sunny", tool_call_id="call_1"),
    ]
    stored = store_messages("chatcmpl-x", messages)
    assert stored == [
        {"id": "chatcmpl-x-0", "role": "system", "content": "Be brief.", "content_parts": None},
        {"id": "chatcmpl-x-1", "role": "user", "content": "Weather?", "name": "ann", "content_parts": None},
        {
            "id": "chatcmpl-x-2",
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
                }
            ],
            "content_parts": None,
        },
        {
            "id": "chatcmpl-x-3",
            "role": "tool",
            "content": "sunny",
            "tool_call_id": "call_1",
            "content_parts": None,
        },
    ]
    # The `openai` package's model types an assistant's (its `role` admits no other).
    assistant = ChatCompletionStoreMessage.model_validate(stored[2])
    assert assistant.tool_calls is not None and assistant.tool_calls[0].id == "call_1"


def test_a_listing_filters_by_every_metadata_pair_given_and_by_the_model_as_named() -> None:
    query = [("limit", "2"), ("metadata[project]", "a b"), ("metadata[]", "empty key"), ("model", "m")]
    wanted = metadata_filter(query)
    assert wanted == {"project": "a b", "": "empty key"}
    kept = {"project": "a b", "": "empty key", "other": "x"}
    assert listed(kept, "m", of_model="m", wanted=wanted)
    assert listed(kept, "m", of_model=None, wanted={})
    assert not listed(kept, "m", of_model="m2", wanted=wanted)
    assert not listed({"project": "a b"}, "m", of_model=None, wanted=wanted)


@pytest.mark.parametrize(
    "query",
    [
        [(f"metadata[k{n}]", "v") for n in range(17)],
        [(f"metadata[{'k' * 65}]", "v")],
        [("metadata[k]", "v" * 513)],
    ],
    ids=["17 pairs", "a key of 65 characters", "a value of 513 characters"],
)
def test_a_listing_filter_past_openais_bounds_of_metadata_is_refused(query: list[tuple[str, str]]) -> None:
    with pytest.raises(InvalidRequest) as refused:
        metadata_filter(query)
    assert refused.value.detail["param"] == "metadata"
