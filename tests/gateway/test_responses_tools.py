"""The Responses API with function tools and reasoning, its pure conversions: function tools, tool
choices and `function_call`, `function_call_output` and `reasoning` input items to the job's chat (as
vLLM's Responses server makes them), the job's reasoning and tool-call parts to `reasoning` and
`function_call` output items and their stream events, each object and event validated strictly
against the Open Responses specification's models (tests/open_responses.py) and, where it has the
type, the `openai` package's."""

from __future__ import annotations

import json
from datetime import datetime, timezone
from typing import Any

import pytest
from openai import omit
from openai._models import construct_type
from openai.lib.streaming.responses._responses import ResponseStreamState
from openai.types.responses import Response, ResponseItemList, ResponseStreamEvent
from pydantic import TypeAdapter, ValidationError

from gateway.admission import check_pool_serves
from gateway.compat.openai_answers import item_list
from gateway.compat.responses_answers import Head, ResponseEvents, Standing, response_object
from gateway.compat.responses_bodies import ResponsesBody, Stored
from shared.chat import FunctionCall, NamedToolChoice, ToolCall
from shared.errors import InvalidRequest
from shared.events import (
    CancelledEvent,
    DeltaEvent,
    DoneEvent,
    Event,
    FunctionDelta,
    JobState,
    StatusEvent,
    TokenLogprob,
    ToolCallDelta,
    TopLogprob,
    Usage,
)
from shared.model_card import ModelCard
from shared.requests import JobOutput, JobRecord
from tests.open_responses import WEATHER_TOOL, valid_event, valid_events, valid_response

JOB_ID = "0123456789abcdef0123456789abcdef"
USAGE = Usage(prompt_tokens=7, completion_tokens=9)
stream_event: TypeAdapter[Any] = TypeAdapter(ResponseStreamEvent)
SPEC_ONLY = {"response.reasoning.delta", "response.reasoning.done"}
"""The specification's names of the reasoning events; OpenAI's types name them `reasoning_text`."""
ARGUMENTS = '{"location": "Paris"}'
HISTORY: list[dict[str, Any]] = [
    {"role": "user", "content": "Weather in Paris?"},
    {
        "type": "reasoning",
        "id": "rs_1",
        "summary": [],
        "content": [{"type": "reasoning_text", "text": "Look."}],
    },
    {
        "type": "function_call",
        "id": "fc_1",
        "call_id": "call_a",
        "name": "get_weather",
        "arguments": ARGUMENTS,
    },
    {
        "type": "function_call",
        "call_id": "call_b",
        "name": "get_weather",
        "arguments": '{"location": "Rome"}',
    },
    {"type": "function_call_output", "call_id": "call_a", "output": "sunny"},
    {"type": "function_call_output", "call_id": "call_b", "output": [{"type": "input_text", "text": "rain"}]},
]


def body(**fields: Any) -> ResponsesBody:
    return ResponsesBody.model_validate({"model": "smol", "input": "Weather?", **fields})


def head(**stored: Any) -> Head:
    return Head(JOB_ID, 1_700_000_000.0, Stored(model="smol", **stored))


def call_part(
    index: int, arguments: str, name: str | None = None, call_id: str | None = None
) -> ToolCallDelta:
    return ToolCallDelta(
        index=index,
        id=call_id,
        type="function" if call_id else None,
        function=FunctionDelta(name=name, arguments=arguments),
    )


def job_stream(*middle: DeltaEvent, end: Event | None = None) -> list[Event]:
    events: list[Event] = [
        StatusEvent(seq=0, state=JobState.queued),
        StatusEvent(seq=1, state=JobState.running),
    ]
    for event in middle:
        events.append(event.model_copy(update={"seq": len(events)}))
    end = end or DoneEvent(seq=0, finish_reason="tool_calls", usage=USAGE)
    return [*events, end.model_copy(update={"seq": len(events)})]


def delta(
    text: str = "", reasoning: str = "", calls: list[ToolCallDelta] | None = None, **more: Any
) -> DeltaEvent:
    return DeltaEvent(seq=0, text=text, reasoning=reasoning, tool_calls=calls, token_ids=[1], **more)


def converted(events: list[Event], of: Head | None = None) -> list[dict[str, Any]]:
    converter = ResponseEvents(of or head(tools=[WEATHER_TOOL | {"strict": None}], tool_choice="auto"))
    return [out for event in events for out in converter.feed(event, 1_700_000_001.5)]


def checked(events: list[dict[str, Any]]) -> Response:
    """Every event valid as the specification's model of its type and, where the `openai` package has
    the type, as its own, read back as sent; the final Response as the package reads it."""
    valid_events(events)
    for event in events:
        if event["type"] not in SPEC_ONLY:
            parsed = stream_event.validate_python(event, strict=True)
            assert parsed.model_dump(mode="json", exclude_unset=True) == event
    return Response.model_validate(events[-1]["response"], strict=True)


THINK_THEN_CALL = [
    delta(reasoning="I should "),
    delta(reasoning="look it up.", text="\n", calls=[call_part(0, '{"loc', "get_weather", "call_x")]),
    delta(calls=[call_part(0, 'ation": "Paris"}')]),
    delta(calls=[call_part(1, "", "get_weather", "call_y"), call_part(1, '{"location": "Rome"}')]),
]


def test_reasoning_text_and_calls_stream_as_items_one_after_another_as_vllm_streams_them() -> None:
    out = converted(job_stream(*THINK_THEN_CALL))
    response = checked(out)
    assert [(event["type"], event.get("output_index")) for event in out[3:]] == [
        ("response.output_item.added", 0),
        ("response.content_part.added", 0),
        ("response.reasoning.delta", 0),
        ("response.reasoning.delta", 0),
        ("response.reasoning.done", 0),
        ("response.content_part.done", 0),
        ("response.output_item.done", 0),
        ("response.output_item.added", 1),
        ("response.content_part.added", 1),
        ("response.output_text.delta", 1),
        ("response.output_text.done", 1),
        ("response.content_part.done", 1),
        ("response.output_item.done", 1),
        ("response.output_item.added", 2),
        ("response.function_call_arguments.delta", 2),
        ("response.function_call_arguments.delta", 2),
        ("response.function_call_arguments.done", 2),
        ("response.output_item.done", 2),
        ("response.output_item.added", 3),
        ("response.function_call_arguments.delta", 3),
        ("response.function_call_arguments.done", 3),
        ("response.output_item.done", 3),
        ("response.completed", None),
    ]
    assert out[-1]["sequence_number"] == len(out) - 1
    reasoning, message, first, second = response.output
    assert (
        reasoning.type == "reasoning"
        and reasoning.content
        and reasoning.content[0].text == "I should look it up."
    )
    assert message.type == "message" and response.output_text == "\n"
    assert first.type == "function_call" and second.type == "function_call"
    assert (first.id, first.call_id, first.name, first.arguments) == (
        f"fc_{JOB_ID}_0",
        "call_x",
        "get_weather",
        ARGUMENTS,
    )
    assert (second.call_id, second.arguments, second.status) == (
        "call_y",
        '{"location": "Rome"}',
        "completed",
    )
    done_items = [event["item"] for event in out if event["type"] == "response.output_item.done"]
    assert done_items == out[-1]["response"]["output"]  # the same items, ids and all
    assert response.tools[0].type == "function" and response.tool_choice == "auto"


def test_the_openai_stream_helper_puts_the_function_calls_together() -> None:
    """As the package reads a stream: each event built by its own `construct_type`, the reasoning events
    (of a type it has none of) included."""
    events = [
        construct_type(type_=ResponseStreamEvent, value=event)
        for event in converted(job_stream(*THINK_THEN_CALL))
    ]
    state: ResponseStreamState[Any] = ResponseStreamState(input_tools=omit, text_format=omit)
    for event in events:
        state.handle_event(event)
    calls = [item for item in events[-1].response.output if item.type == "function_call"]
    assert [(call.name, json.loads(call.arguments)) for call in calls] == [
        ("get_weather", {"location": "Paris"}),
        ("get_weather", {"location": "Rome"}),
    ]


def test_a_call_cut_by_a_cancel_is_closed_incomplete_and_the_response_keeps_it() -> None:
    out = converted(job_stream(*THINK_THEN_CALL[:2], end=CancelledEvent(seq=0, usage=USAGE)))
    for event in out[:-1]:
        valid_event(event)
    assert valid_response(out[-1]["response"]).status == "cancelled"
    assert out[-2]["type"] == "response.output_item.done" and out[-2]["item"]["status"] == "incomplete"
    statuses = [(item["type"], item["status"]) for item in out[-1]["response"]["output"]]
    assert statuses == [("reasoning", "completed"), ("message", "completed"), ("function_call", "incomplete")]


def test_a_response_without_output_has_no_item() -> None:
    out = converted(job_stream(end=DoneEvent(seq=0, finish_reason="stop", usage=USAGE)))
    assert checked(out).output == [] and [event["type"] for event in out][-1] == "response.completed"


def logprob(token: str, value: float) -> TokenLogprob:
    alternatives = [
        TopLogprob(token_id=1, token=token, logprob=value),
        TopLogprob(token_id=2, token="x", logprob=-9),
    ]
    return TokenLogprob(token_id=1, token=token, logprob=value, top_logprobs=alternatives)


def test_the_output_texts_logprobs_come_with_its_deltas_and_its_part_when_included() -> None:
    of = head(output_logprobs=True, top_logprobs=1)
    out = converted(
        job_stream(
            delta(text="Ro", logprobs=[logprob("Ro", -0.5)]),
            delta(text="me", logprobs=[logprob("me", -1e6)]),
            end=DoneEvent(seq=0, finish_reason="stop", usage=USAGE),
        ),
        of,
    )
    response = checked(out)
    deltas = [event for event in out if event["type"] == "response.output_text.delta"]
    assert deltas[0]["logprobs"] == [
        {
            "token": "Ro",
            "logprob": -0.5,
            "bytes": [82, 111],
            "top_logprobs": [{"token": "Ro", "logprob": -0.5, "bytes": [82, 111]}],
        }
    ]
    assert deltas[1]["logprobs"][0]["logprob"] == -9999.0  # as vLLM bounds it
    [message] = response.output
    assert message.type == "message" and [entry.token for entry in message.content[0].logprobs or []] == [
        "Ro",
        "me",
    ]
    assert response.top_logprobs == 1
    # Not asked for: none.
    plain = converted(job_stream(delta(text="Ro", logprobs=[logprob("Ro", -0.5)])))
    assert [event["logprobs"] for event in plain if event["type"] == "response.output_text.delta"] == [[]]


def record(**output: Any) -> JobRecord:
    moment = datetime(2026, 11, 29, tzinfo=timezone.utc)
    return JobRecord(
        id=JOB_ID,
        status=JobState.completed,
        created_at=moment,
        started_at=moment,
        finished_at=moment,
        output=JobOutput(token_count=9, **output),
        finish_reason="tool_calls",
        usage=USAGE,
    )


def test_a_whole_response_holds_reasoning_message_and_calls_in_vllms_order_with_the_streamed_ids() -> None:
    calls = [ToolCall(id="call_x", function=FunctionCall(name="get_weather", arguments=ARGUMENTS))]
    whole = response_object(head(), Standing.of_record(record(text="\n", reasoning="Hm.", tool_calls=calls)))
    resource = valid_response(whole)
    assert [item.root.type if hasattr(item, "root") else item.type for item in resource.output] == [
        "reasoning",
        "message",
        "function_call",
    ]
    parsed = Response.model_validate(whole, strict=True)
    assert [item.id for item in parsed.output] == [f"rs_{JOB_ID}", f"msg_{JOB_ID}", f"fc_{JOB_ID}_0"]
    streamed = converted(
        job_stream(
            delta(reasoning="Hm.", text="\n", calls=[call_part(0, ARGUMENTS, "get_weather", "call_x")])
        )
    )
    assert streamed[-1]["response"]["output"] == whole["output"]


def test_function_tools_and_a_history_of_calls_reasoning_and_results_make_the_jobs_chat() -> None:
    request = body(
        instructions="Be brief.",
        input=HISTORY,
        tools=[WEATHER_TOOL],
        tool_choice={"type": "function", "name": "get_weather"},
        parallel_tool_calls=False,
        reasoning={"effort": "low", "summary": "auto"},
    )
    request.refuse_unsupported()
    job = request.job_request(2048)
    messages = [message.model_dump(exclude_none=True) for message in job.messages or []]
    assert messages == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Weather in Paris?"},
        {
            "role": "assistant",
            "content": "",
            "reasoning": "Look.",
            "tool_calls": [
                {
                    "id": "call_a",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": ARGUMENTS},
                },
                {
                    "id": "call_b",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"location": "Rome"}'},
                },
            ],
        },
        {"role": "tool", "content": "sunny", "tool_call_id": "call_a"},
        {"role": "tool", "content": "rain", "tool_call_id": "call_b"},
    ]
    assert job.tools is not None and job.tools[0].model_dump(exclude_none=True) == {
        "type": "function",
        "function": {k: v for k, v in WEATHER_TOOL.items() if k != "type"},
    }
    assert job.tool_choice == NamedToolChoice(function={"name": "get_weather"})
    assert (job.parallel_tool_calls, job.reasoning_effort) == (False, "low")
    stored = request.stored(job)
    assert Stored.of_annotations(stored.annotations()) == stored
    resource = valid_response(response_object(Head(JOB_ID, 1.0, stored), Standing("queued")))
    assert resource.tool_choice.type == "function" and resource.tool_choice.name == "get_weather"
    assert resource.reasoning is not None and resource.reasoning.effort == "low"
    assert resource.parallel_tool_calls is False and resource.tools[0].root.name == "get_weather"
    Response.model_validate(response_object(Head(JOB_ID, 1.0, stored), Standing("queued")), strict=True)


def test_the_input_items_list_the_calls_reasoning_and_results_as_given() -> None:
    request = body(input=HISTORY, tools=[WEATHER_TOOL])
    job = request.job_request(2048)
    items = request.stored(job).input_items(JOB_ID, job.messages or [])
    page = ResponseItemList.model_validate(item_list(items, 10, True, None), strict=True)
    assert [(item.type, item.id) for item in page.data] == [
        ("message", f"msg_{JOB_ID}_0"),
        ("reasoning", "rs_1"),
        ("function_call", "fc_1"),
        ("function_call", f"fc_{JOB_ID}_3"),
        ("function_call_output", f"fco_{JOB_ID}_4"),
        ("function_call_output", f"fco_{JOB_ID}_5"),
    ]
    assert items[3]["arguments"] == '{"location": "Rome"}' and items[5]["output"] == "rain"
    assert items[1]["content"] == [{"type": "reasoning_text", "text": "Look."}]


@pytest.mark.parametrize(
    ("choice", "tools", "job_choice", "reported"),
    [
        (None, [WEATHER_TOOL], "auto", "auto"),
        ("required", [WEATHER_TOOL], "required", "required"),
        ("none", [WEATHER_TOOL], "none", "none"),
        (None, None, None, "none"),
        ("auto", [], None, "none"),
    ],
)
def test_a_tool_choice_is_the_jobs_and_is_reported_as_vllm_reports_it(
    choice: str | None, tools: list[dict[str, Any]] | None, job_choice: str | None, reported: str
) -> None:
    request = body(tool_choice=choice, tools=tools)
    request.refuse_unsupported()
    job = request.job_request(2048)
    assert job.tool_choice == job_choice and request.stored(job).tool_choice == reported


def test_include_logprobs_truncation_and_reasoning_become_the_jobs_fields() -> None:
    request = body(
        include=["message.output_text.logprobs", "reasoning.encrypted_content"],
        top_logprobs=3,
        truncation="auto",
    )
    job = request.job_request(2048)
    assert (job.logprobs, job.truncate_prompt_tokens) == (3, -1)
    stored = request.stored(job)
    assert (stored.output_logprobs, stored.top_logprobs, stored.truncation) == (True, 3, "auto")
    assert body(top_logprobs=3).job_request(2048).logprobs is None  # as vLLM: only with `include`
    off = body(include_reasoning=False, chat_template_kwargs={"enable_thinking": False}).job_request(2048)
    assert (off.include_reasoning, off.chat_template_kwargs) == (False, {"enable_thinking": False})


def test_an_assistant_message_cut_short_is_continued() -> None:
    cut = {
        "type": "message",
        "role": "assistant",
        "status": "incomplete",
        "content": [{"type": "output_text", "text": "Ro"}],
    }
    job = body(input=[{"role": "user", "content": "Say Rome"}, cut]).job_request(2048)
    assert (job.add_generation_prompt, job.continue_final_message) == (False, True)
    assert (job.messages or [])[-1].content == "Ro"


@pytest.mark.parametrize(
    ("fields", "param", "message"),
    [
        (
            {"tool_choice": "required"},
            "tool_choice",
            "Tool choice 'required' must be specified with 'tools' parameter.",
        ),
        (
            {"tools": [WEATHER_TOOL], "tool_choice": {"type": "function", "name": "other"}},
            "tool_choice",
            "Tool choice 'function' not found in 'tools' parameter.",
        ),
        (
            {"tool_choice": {"type": "function", "name": "get_weather"}},
            "tool_choice",
            "Tool choice 'function' not found in 'tools' parameter.",
        ),
        (
            {"input": [{"type": "reasoning", "summary": [], "encrypted_content": "gAAA"}]},
            "input.0",
            "Encrypted content is not supported.",
        ),
    ],
)
def test_what_vllm_refuses_is_refused_in_its_words(fields: dict[str, Any], param: str, message: str) -> None:
    with pytest.raises(InvalidRequest) as refused:
        body(**fields).refuse_unsupported()
    assert (refused.value.detail["param"], refused.value.message) == (param, message)


def test_a_malformed_function_tool_is_refused_naming_it() -> None:
    with pytest.raises(InvalidRequest) as refused:
        body(tools=[{"type": "function", "parameters": {}}]).refuse_unsupported()
    assert refused.value.detail["param"] == "tools.0.name"
    with pytest.raises(ValidationError):
        body(input=[{"type": "item_reference", "id": "x"}])


def test_more_calls_in_one_turn_than_a_message_holds_are_refused_naming_the_input() -> None:
    calls = [
        {"type": "function_call", "call_id": f"call_{n}", "name": "get_weather", "arguments": "{}"}
        for n in range(129)
    ]
    with pytest.raises(InvalidRequest) as refused:
        body(input=calls).job_request(2048)
    assert refused.value.detail["param"] == "input"


@pytest.mark.parametrize(
    ("choice", "message"),
    [
        (None, '"auto" tool choice requires --enable-auto-tool-choice and --tool-call-parser to be set'),
        ("required", 'tool_choice="required" requires --tool-call-parser to be set'),
        (
            {"type": "function", "name": "get_weather"},
            'tool_choice=function "get_weather" requires --tool-call-parser to be set',
        ),
    ],
)
def test_a_tool_choice_on_a_pool_without_a_parser_is_refused_as_on_chat(
    card: ModelCard, choice: Any, message: str
) -> None:
    """Admission's check of the job: a pool started without a tool-call parser cannot follow the choice
    (vLLM's Responses server would answer the output unparsed); `none` needs none."""
    without = card.model_copy(update={"tool_call_parser": None})
    job = body(tools=[WEATHER_TOOL], tool_choice=choice).job_request(2048)
    with pytest.raises(InvalidRequest) as refusal:
        check_pool_serves(job, without)
    assert (refusal.value.message, refusal.value.detail["param"]) == (message, "tool_choice")
    check_pool_serves(body(tools=[WEATHER_TOOL], tool_choice="none").job_request(2048), without)


def test_fields_no_api_defines_are_taken_and_named_as_on_chat() -> None:
    """As vLLM's Responses request: a field it does not define is taken and ignored; the route names it
    in `X-Streampool-Ignored-Fields`."""
    given = body(input="Hi", client_tag="x", text={"format": {"type": "text"}, "hint": 1})
    assert given.ignored_fields == ["client_tag", "text.hint"]
    assert given.job_request(2048) == body(input="Hi").job_request(2048)
    assert body(input="Hi").ignored_fields == []
