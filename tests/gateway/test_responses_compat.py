"""The Responses API's pure conversions: request bodies to jobs, job events to response events and
Response objects, each event validated strictly against the `openai` package's own types and the Open
Responses specification's models (tests/open_responses.py)."""

from __future__ import annotations

from typing import Any

import openresponses_types as spec
import pytest
from openai.types.responses import Response, ResponseItemList, ResponseStreamEvent
from openai.types.responses.response_format_text_json_schema_config import ResponseFormatTextJSONSchemaConfig
from pydantic import TypeAdapter

from gateway.compat.openai_answers import item_list
from gateway.compat.responses_answers import (
    Head,
    ResponseEvents,
    Standing,
    response_object,
    whole_items,
)
from gateway.compat.responses_bodies import ResponsesBody, Stored
from shared.errors import InvalidRequest
from shared.events import (
    CancelledEvent,
    DeltaEvent,
    DoneEvent,
    ErrorEvent,
    Event,
    JobState,
    StatusEvent,
    Usage,
)
from shared.requests import ChatMessage
from tests.open_responses import valid_event, valid_events, valid_response

JOB_ID = "0123456789abcdef0123456789abcdef"
STORED = Stored(model="smol", background=True, metadata={"topic": "rome"})
HEAD = Head(JOB_ID, 1_700_000_000.0, STORED)
USAGE = Usage(prompt_tokens=7, completion_tokens=3)
stream_event: TypeAdapter[Any] = TypeAdapter(ResponseStreamEvent)
IMAGE = {"type": "input_image", "image_url": "data:image/png;base64,iVBORw0KGgo="}


def job_stream(*middle: Event, end: Event | None = None) -> list[Event]:
    """queued, running, `middle`, then `end` (done after the middle by default), seq in order."""
    events: list[Event] = [
        StatusEvent(seq=0, state=JobState.queued),
        StatusEvent(seq=1, state=JobState.running),
    ]
    for event in middle:
        events.append(event.model_copy(update={"seq": len(events)}))
    end = end or DoneEvent(seq=0, finish_reason="stop", usage=USAGE)
    return [*events, end.model_copy(update={"seq": len(events)})]


def delta(text: str) -> DeltaEvent:
    return DeltaEvent(seq=0, text=text, token_ids=[1])


def converted(events: list[Event]) -> list[dict[str, Any]]:
    converter = ResponseEvents(HEAD)
    return [out for event in events for out in converter.feed(event, 1_700_000_001.5)]


def test_a_whole_stream_makes_every_event_the_sdk_knows_numbered_without_a_gap() -> None:
    out = converted(job_stream(delta("Rome "), delta("was "), delta("great")))
    parsed = [stream_event.validate_python(event, strict=True) for event in out]
    assert [event.type for event in parsed] == [
        "response.created",
        "response.queued",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
        "response.output_text.delta",
        "response.output_text.delta",
        "response.output_text.delta",
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed",
    ]
    assert [event.sequence_number for event in parsed] == list(range(len(parsed)))
    final = parsed[-1].response
    assert (final.id, final.status, final.output_text) == (f"resp_{JOB_ID}", "completed", "Rome was great")
    assert final.usage.input_tokens == 7 and final.usage.output_tokens == 3 and final.usage.total_tokens == 10
    assert final.metadata == {"topic": "rome"} and final.background is True
    assert final.completed_at == 1_700_000_001
    assert parsed[8].text == "Rome was great" and parsed[10].item.status == "completed"


def test_events_are_numbered_over_the_stream_from_its_start_so_a_resumed_run_goes_on_as_one_sequence() -> (
    None
):
    resumed = StatusEvent(seq=0, state=JobState.running, resumed=True, attempt=2)
    events = job_stream(delta("a"), resumed, delta("b"))
    out = converted(events)
    assert [event["sequence_number"] for event in out] == list(range(len(out)))
    assert [event["type"] for event in out][5:8] == [
        "response.output_text.delta",
        "response.in_progress",
        "response.output_text.delta",
    ]
    # A reader that starts at the resumed run's event numbers it as one from the start does.
    late = ResponseEvents(HEAD)
    for event in events[:3]:
        late.feed(event, 0.0)
    assert late.feed(events[3], 0.0) == [event for event in out if event["sequence_number"] == 6]


def test_a_response_cut_by_max_output_tokens_ends_incomplete_with_the_reason() -> None:
    out = converted(job_stream(delta("Rome"), end=DoneEvent(seq=0, finish_reason="length", usage=USAGE)))
    final = stream_event.validate_python(out[-1], strict=True)
    assert final.type == "response.incomplete"
    assert (final.response.status, final.response.incomplete_details.reason) == (
        "incomplete",
        "max_output_tokens",
    )
    assert final.response.output[0].status == "incomplete" and final.response.completed_at is None


def test_a_failed_job_closes_its_output_and_ends_failed_with_the_error() -> None:
    out = converted(
        job_stream(delta("Ro"), end=ErrorEvent(seq=0, message="engine died", code="engine_error"))
    )
    final = stream_event.validate_python(out[-1], strict=True)
    assert [event["type"] for event in out][-4:-1] == [
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
    ]
    assert final.type == "response.failed" and final.response.status == "failed"
    assert final.response.error.message == "engine died" and final.response.output_text == "Ro"


def test_a_response_cancelled_while_queued_ends_at_number_2_cancelled_with_no_output() -> None:
    events: list[Event] = [StatusEvent(seq=0, state=JobState.queued), CancelledEvent(seq=1, usage=USAGE)]
    out = converted(events)
    assert [(event["type"], event["sequence_number"]) for event in out][-1] == ("response.cancelled", 2)
    cancelled = Response.model_validate(out[-1]["response"], strict=True)
    assert (cancelled.status, cancelled.output) == ("cancelled", [])


def test_a_response_cancelled_mid_generation_keeps_its_text() -> None:
    out = converted(job_stream(delta("Rome"), end=CancelledEvent(seq=0, usage=USAGE)))
    cancelled = Response.model_validate(out[-1]["response"], strict=True)
    assert (out[-1]["type"], cancelled.status, cancelled.output_text) == (
        "response.cancelled",
        "cancelled",
        "Rome",
    )


def test_the_response_object_as_polled_parses_strictly_with_its_output_so_far() -> None:
    running = Response.model_validate(
        response_object(HEAD, Standing("in_progress", whole_items(JOB_ID, "Ro"))), strict=True
    )
    assert (running.status, running.output_text, running.output[0].status) == (
        "in_progress",
        "Ro",
        "in_progress",
    )
    queued = Response.model_validate(response_object(HEAD, Standing("queued")), strict=True)
    assert (queued.status, queued.output, queued.usage) == ("queued", [], None)


@pytest.mark.parametrize(
    ("end", "status"),
    [
        (DoneEvent(seq=0, finish_reason="stop", usage=USAGE), "completed"),
        (DoneEvent(seq=0, finish_reason="length", usage=USAGE), "incomplete"),
        (ErrorEvent(seq=0, message="engine died", code="engine_error"), "failed"),
    ],
)
def test_every_event_validates_as_its_open_responses_model_and_reads_back_the_same_through_the_sdk(
    end: Event, status: str
) -> None:
    out = converted(job_stream(delta("Rome "), delta("was"), end=end))
    assert valid_events(out).status == status
    for event in out:
        parsed = stream_event.validate_python(event, strict=True)
        assert parsed.model_dump(mode="json", exclude_unset=True) == event  # no field read otherwise


@pytest.mark.parametrize(
    "standing",
    [
        Standing("queued"),
        Standing("in_progress", whole_items(JOB_ID, "Ro")),
        Standing("completed", whole_items(JOB_ID, "Rome"), USAGE, completed_at=1_700_000_001.5),
        Standing("incomplete", whole_items(JOB_ID, "Rome"), USAGE),
        Standing("cancelled"),
        Standing("cancelled", whole_items(JOB_ID, "Ro"), USAGE),
        Standing("failed", whole_items(JOB_ID, "Ro"), error="engine died"),
    ],
    ids=lambda standing: f"{standing.status}{'' if standing.output is None else ' with output'}",
)
def test_the_response_object_at_every_status_is_a_resource_of_the_spec_that_the_sdk_reads_as_sent(
    standing: Standing,
) -> None:
    response = response_object(HEAD, standing)
    resource = valid_response(response)
    assert (resource.status, resource.reasoning, resource.max_tool_calls) == (standing.status, None, None)
    assert (resource.top_logprobs, resource.service_tier, resource.tools) == (0, "default", [])
    parsed = Response.model_validate(response, strict=True)
    assert parsed.model_dump(mode="json", exclude_unset=True) == response


def test_a_cancelled_stream_ends_with_a_response_of_the_spec_though_its_event_type_is_not() -> None:
    out = converted(job_stream(delta("Rome"), end=CancelledEvent(seq=0, usage=USAGE)))
    for event in out[:-1]:
        valid_event(event)
    assert out[-1]["type"] == "response.cancelled"  # OpenAI's name; the specification has no such event
    assert valid_response(out[-1]["response"]).status == "cancelled"


def body(**fields: Any) -> ResponsesBody:
    return ResponsesBody.model_validate({"model": "smol", "input": "Go on.", **fields})


def test_a_body_becomes_chat_messages_instructions_first_then_the_previous_conversation() -> None:
    previous = [ChatMessage(role="user", content="Hi"), ChatMessage(role="assistant", content="Hello")]
    request = body(
        instructions="Be brief.",
        input=[
            {"role": "developer", "content": "No lists."},
            {"type": "message", "role": "user", "content": "More?"},
        ],
        max_output_tokens=12,
        temperature=0,
        top_k=-1,
        text={"format": {"type": "json_schema", "name": "x", "schema": {"type": "object"}}},
    )
    job = request.job_request(2048)
    stored = request.stored(job)
    turn = request.turn("0" * 32, tuple(previous))
    assert [(m.role, m.content) for m in job.messages or []] == [
        ("system", "Be brief."),
        ("system", "No lists."),
        ("user", "More?"),
    ]
    assert turn.own(turn.whole(job)) == job
    assert [(m.role, m.content) for m in turn.whole(job).messages or []] == [
        ("system", "Be brief."),
        ("user", "Hi"),
        ("assistant", "Hello"),
        ("system", "No lists."),
        ("user", "More?"),
    ]
    assert (job.max_tokens, job.temperature, job.top_k) == (12, 0.0, None)
    assert job.structured_outputs is not None and job.structured_outputs.json_ == {"type": "object"}
    assert Stored.of_annotations(stored.annotations()) == stored
    assert Stored.of_annotations({"api": "job"}) is None


def test_the_response_reports_the_sampling_values_its_job_used_the_defaults_included() -> None:
    request = body()
    defaults = request.stored(request.job_request(2048))
    assert (defaults.temperature, defaults.top_p, defaults.presence_penalty, defaults.frequency_penalty) == (
        1.0,
        1.0,
        0.0,
        0.0,
    )
    request = body(
        temperature=0.2, top_p=0.9, presence_penalty=0.5, frequency_penalty=-0.5, safety_identifier="u-1"
    )
    job = request.job_request(2048)
    stored = request.stored(job)
    assert Stored.of_annotations(stored.annotations()) == stored
    resource = valid_response(response_object(Head(JOB_ID, 1_700_000_000.0, stored), Standing("queued")))
    reported = (resource.temperature, resource.top_p, resource.presence_penalty, resource.frequency_penalty)
    assert reported == (job.temperature, job.top_p, job.presence_penalty, job.frequency_penalty)
    assert reported == (0.2, 0.9, 0.5, -0.5)
    assert (resource.safety_identifier, resource.prompt_cache_key) == ("u-1", None)


def test_a_record_that_kept_null_sampling_values_reports_the_jobs_defaults() -> None:
    annotations = STORED.annotations() | {"temperature": "null", "top_p": "null"}
    stored = Stored.of_annotations(annotations)
    assert stored is not None and (stored.temperature, stored.top_p) == (1.0, 1.0)


def test_a_json_schema_format_is_reported_strict_with_its_description_as_both_models_have_it() -> None:
    schema = {"type": "object"}
    request = body(text={"format": {"type": "json_schema", "name": "x", "schema": schema, "strict": False}})
    reported = request.stored(request.job_request(2048)).text["format"]
    assert reported == {
        "type": "json_schema",
        "name": "x",
        "schema": schema,
        "description": None,
        "strict": True,
    }
    ResponseFormatTextJSONSchemaConfig.model_validate(reported, strict=True)
    # The published models type `schema` as null (their generator lost its type): all else holds.
    spec.JsonSchemaResponseFormat.model_validate(reported | {"schema": None})


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"tools": [{"type": "web_search"}]}, "tools"),
        ({"max_tool_calls": 2}, "max_tool_calls"),
        ({"background": True, "store": False}, "background"),
        ({"top_logprobs": 21}, "top_logprobs"),
        ({"text": {"format": {"type": "json_schema", "name": "x"}}}, "text.format"),
        ({"text": {"format": {"type": "json_schema", "schema": {}}}}, "text.format.name"),
        (
            {
                "input": [
                    {"role": "user", "content": "Hi"},
                    {"role": "user", "content": [{"type": "input_text", "text": "See"}, IMAGE]},
                ]
            },
            "input.1.content.1",
        ),
    ],
)
def test_what_a_job_cannot_do_is_refused_naming_the_parameter(fields: dict[str, Any], param: str) -> None:
    with pytest.raises(InvalidRequest) as refused:
        body(**fields).refuse_unsupported()
    assert refused.value.detail["param"] == param
    assert refused.value.detail["code"] == "unsupported_parameter"


def test_a_job_field_refused_is_named_as_the_responses_parameter() -> None:
    with pytest.raises(InvalidRequest) as refused:
        body(max_output_tokens=0).job_request(2048)
    assert refused.value.detail["param"] == "max_output_tokens"


def test_input_items_page_in_either_order_after_an_item() -> None:
    request = body(input=[{"role": "user", "content": str(n)} for n in range(5)])
    job = request.job_request(2048)
    items = request.stored(job).input_items(JOB_ID, job.messages or [])
    page = ResponseItemList.model_validate(item_list(items, 2, False, None), strict=True)
    assert [item.content[0].text for item in page.data] == ["4", "3"] and page.has_more
    rest = item_list(items, 10, False, page.last_id)
    assert [item["content"][0]["text"] for item in rest["data"]] == ["2", "1", "0"] and not rest["has_more"]
    assert item_list(items, 1, True, None)["first_id"] == f"msg_{JOB_ID}_0"
