"""The Open Responses specification's compliance suite in the tests: its requests, and its validator
made of the specification's published models (`openresponses-types`): a Response object as
`ResponseResource`, each streamed event as the model of its type, and an error as the specification's
error object; strictly, from the JSON as sent."""

from __future__ import annotations

import json
from typing import Any

import openresponses_types as spec
from pydantic import BaseModel

EVENT_MODELS: dict[str, type[BaseModel]] = {
    "response.created": spec.ResponseCreatedStreamingEvent,
    "response.queued": spec.ResponseQueuedStreamingEvent,
    "response.in_progress": spec.ResponseInProgressStreamingEvent,
    "response.completed": spec.ResponseCompletedStreamingEvent,
    "response.failed": spec.ResponseFailedStreamingEvent,
    "response.incomplete": spec.ResponseIncompleteStreamingEvent,
    "response.output_item.added": spec.ResponseOutputItemAddedStreamingEvent,
    "response.output_item.done": spec.ResponseOutputItemDoneStreamingEvent,
    "response.content_part.added": spec.ResponseContentPartAddedStreamingEvent,
    "response.content_part.done": spec.ResponseContentPartDoneStreamingEvent,
    "response.output_text.delta": spec.ResponseOutputTextDeltaStreamingEvent,
    "response.output_text.done": spec.ResponseOutputTextDoneStreamingEvent,
    "response.reasoning.delta": spec.ResponseReasoningDeltaStreamingEvent,
    "response.reasoning.done": spec.ResponseReasoningDoneStreamingEvent,
    "response.function_call_arguments.delta": spec.ResponseFunctionCallArgumentsDeltaStreamingEvent,
    "response.function_call_arguments.done": spec.ResponseFunctionCallArgumentsDoneStreamingEvent,
}
"""The specification's model of each event type a response streams: its text, reasoning and calls."""
ENDS = {"response.completed", "response.incomplete", "response.failed"}

WEATHER_TOOL = {
    "type": "function",
    "name": "get_weather",
    "description": "Get the current weather for a location",
    "parameters": {
        "type": "object",
        "properties": {
            "location": {"type": "string", "description": "The city and state, e.g. San Francisco, CA"}
        },
        "required": ["location"],
    },
}
WEATHER = [{"type": "message", "role": "user", "content": "What's the weather like in San Francisco?"}]
SUITE: dict[str, dict[str, Any]] = {
    "basic-response": {
        "input": [{"type": "message", "role": "user", "content": "Say hello in exactly 3 words."}]
    },
    "streaming-response": {
        "input": [{"type": "message", "role": "user", "content": "Count from 1 to 5."}],
        "stream": True,
    },
    "system-prompt": {
        "input": [
            {
                "type": "message",
                "role": "system",
                "content": "You are a pirate. Always respond in pirate speak.",
            },
            {"type": "message", "role": "user", "content": "Say hello."},
        ]
    },
    "multi-turn": {
        "input": [
            {"type": "message", "role": "user", "content": "My name is Alice."},
            {
                "type": "message",
                "role": "assistant",
                "content": "Hello Alice! Nice to meet you. How can I help you today?",
            },
            {"type": "message", "role": "user", "content": "What is my name?"},
        ]
    },
    "tool-calling": {"input": WEATHER, "tools": [WEATHER_TOOL]},
    "tool-calling-streaming": {"input": WEATHER, "tools": [WEATHER_TOOL], "stream": True},
    "image-input": {
        "input": [
            {
                "type": "message",
                "role": "user",
                "content": [
                    {"type": "input_text", "text": "What do you see in this image? Answer in one sentence."},
                    # The suite's is a 32-pixel PNG; a text model refuses any image.
                    {"type": "input_image", "image_url": "data:image/png;base64,iVBORw0KGgo="},
                ],
            }
        ]
    },
}
"""The suite's requests by its tests' ids, but for `model`; each is sent with `stream` (false where
not given)."""
TEXT_TESTS = ("basic-response", "streaming-response", "system-prompt", "multi-turn")


def suite_request(test: str, model: str) -> dict[str, Any]:
    return {"model": model, **SUITE[test], "stream": SUITE[test].get("stream", False)}


def valid_response(response: dict[str, Any]) -> spec.ResponseResource:
    return spec.ResponseResource.model_validate_json(json.dumps(response), strict=True)


def valid_event(event: dict[str, Any]) -> BaseModel:
    """The event as the model of its type; an event of a type the specification has none of fails."""
    assert event["type"] in EVENT_MODELS, f"no Open Responses event is of type {event['type']!r}"
    return EVENT_MODELS[event["type"]].model_validate_json(json.dumps(event), strict=True)


def valid_events(events: list[dict[str, Any]]) -> spec.ResponseResource:
    """Validate every event of a stream, numbered without a gap, that ends with a Response: that one."""
    for event in events:
        valid_event(event)
    numbers = [event["sequence_number"] for event in events]
    assert numbers == list(range(numbers[0], numbers[0] + len(numbers))), numbers
    assert events[-1]["type"] in ENDS, events[-1]["type"]
    return valid_response(events[-1]["response"])


def valid_error(body: dict[str, Any]) -> spec.Error:
    """An error answer's `error`, as the specification's error object (its `code` a string)."""
    assert set(body) == {"error"}, body
    return spec.Error.model_validate_json(json.dumps(body["error"]), strict=True)
