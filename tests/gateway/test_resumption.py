"""What a kept answer keeps beside its job is all its chunks take from the request: framed again from
the annotations, the same events make the same chunks, echo and usage so far included; and what keeps
a job running past its client."""

from __future__ import annotations

from typing import Any

import pytest

from gateway.compat.openai_bodies import ChatBody, CompletionBody
from gateway.resumption import FRAMING, KEEP_RUNNING_HEADER, Framing, keeps_running
from shared.events import DeltaEvent, DoneEvent, Event, StatusEvent, Usage
from shared.events import JobState as State

MODEL = "my-model"  # as the request names it; the job carries the model it resolves to
EVENTS: list[Event] = [
    StatusEvent(seq=0, state=State.queued),
    StatusEvent(seq=1, state=State.running),
    DeltaEvent(seq=2, text="Paris", token_ids=[7]),
    StatusEvent(seq=3, state=State.running, resumed=True, attempt=2),  # another worker took it over
    DeltaEvent(seq=4, text=".", token_ids=[8, 9]),
    DoneEvent(seq=5, finish_reason="stop", usage=Usage(prompt_tokens=5, completion_tokens=3)),
]


def _chunks(framing: Framing) -> list[dict[str, Any]]:
    stream = framing.chunks("0" * 32, created=1_700_000_000)
    return [chunk for event in EVENTS for chunk in stream.feed(event)]


@pytest.mark.parametrize(
    "body",
    [
        ChatBody.model_validate(
            {
                "model": MODEL,
                "messages": [
                    {"role": "user", "content": "Capital?"},
                    {"role": "assistant", "content": "It is"},
                ],
                "add_generation_prompt": False,
                "continue_final_message": True,
                "echo": True,
                "stream": True,
                "store": True,
                "stream_options": {"include_usage": True, "continuous_usage_stats": True},
            }
        ),
        CompletionBody.model_validate(
            {"model": MODEL, "prompt": "The capital is", "echo": True, "stream": True, "max_tokens": 4}
        ),
    ],
    ids=["chat", "completion"],
)
def test_a_kept_framing_makes_the_original_chunks_again(body: ChatBody | CompletionBody) -> None:
    original = Framing.of(body, prompt_tokens=4)
    kept = Framing.of_annotations(original.annotations())
    assert kept == original
    chunks = _chunks(original)
    assert _chunks(kept) == chunks
    assert {chunk["model"] for chunk in chunks} == {MODEL}
    assert {chunk["created"] for chunk in chunks} == {1_700_000_000}


def test_a_job_without_a_framing_or_with_a_broken_one_has_none() -> None:
    assert Framing.of_annotations({}) is None
    assert Framing.of_annotations({FRAMING: "{"}) is None
    assert Framing.of_annotations({"store": "true"}) is None


@pytest.mark.parametrize(
    ("store", "headers", "kept"),
    [
        (True, {}, True),
        (False, {}, False),
        (None, {}, False),
        (None, {KEEP_RUNNING_HEADER: "true"}, True),
        (False, {KEEP_RUNNING_HEADER: " True "}, True),
        (None, {KEEP_RUNNING_HEADER: "1"}, False),
    ],
)
def test_a_stored_chat_or_the_header_keeps_a_job_running(
    store: bool | None, headers: dict[str, str], kept: bool
) -> None:
    chat = ChatBody.model_validate(
        {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "store": store}
    )
    assert keeps_running(chat, headers) is kept
    completion = CompletionBody.model_validate({"model": MODEL, "prompt": "hi"})
    assert keeps_running(completion, headers) is (KEEP_RUNNING_HEADER in headers and kept)
