"""Chat completions with tools, tool history, reasoning and the chat template's controls, as vLLM's
OpenAI server takes and answers them, without an engine.

Bodies are checked against vLLM's own `ChatCompletionRequest` (the same body, the same refusal in the
same words); answers and chunks against vLLM's own response models and the `openai` package's. The
last tests run a gateway process on the real Redis, with model cards standing in for a pool with and
without a tool-call parser, and write a job's events as a worker would.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import pytest
import redis.asyncio as aioredis
from openai.lib.streaming.chat import ChatCompletionStreamState
from openai.types.chat import ChatCompletion, ChatCompletionChunk
from pydantic import ValidationError

from gateway.admission import check_pool_serves
from gateway.compat.openai_answers import Answer, ChunkStream
from gateway.compat.openai_bodies import ChatBody
from gateway.generation import Collected, whole_answer
from shared.config import Settings
from shared.errors import InvalidRequest
from shared.events import (
    DeltaEvent,
    DoneEvent,
    Event,
    FunctionDelta,
    TokenLogprob,
    ToolCallDelta,
    TopLogprob,
    Usage,
)
from shared.keys import Keys
from shared.model_card import ModelCard, publish_model_card
from tests.gateway.keyed_gateway import KeyedGateway, run_gateway
from tests.gateway.stand_ins import CARD_MODEL, heartbeat
from tests.helpers import eventually, notify, scrape
from tests.vllm_protocol import vllm_protocol

LIMIT = 2048
WEATHER: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}
TIME = {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object"}}}
HISTORY: list[dict[str, Any]] = [
    {"role": "developer", "content": "Answer briefly."},
    {"role": "user", "content": "Weather in Paris?", "name": "ann"},
    {
        "role": "assistant",
        "content": None,
        "reasoning_content": "I should call the tool.",
        "tool_calls": [
            {
                "id": "call_1",
                "type": "function",
                "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
            }
        ],
    },
    {"role": "tool", "tool_call_id": "call_1", "content": "sunny, 21 C"},
]
ASK = [{"role": "user", "content": "Weather in Paris?"}]
USAGE = Usage(prompt_tokens=11, completion_tokens=6)


def _body(**fields: Any) -> dict[str, Any]:
    return {"model": CARD_MODEL, "messages": HISTORY, "tools": [WEATHER, TIME], **fields}


def _chat(**fields: Any) -> ChatBody:
    return ChatBody.model_validate(_body(**fields))


# Bodies


def test_tools_and_a_history_of_calls_and_results_reach_the_job() -> None:
    body = _body(
        tool_choice={"type": "function", "function": {"name": "get_time"}}, parallel_tool_calls=False
    )
    vllm_protocol().ChatCompletionRequest.model_validate(json.loads(json.dumps(body)))  # vLLM takes it too
    job = ChatBody.model_validate(body).job_request(LIMIT)
    assert job.messages is not None and job.tools is not None
    assert [(m.role, m.content, m.name, m.tool_call_id) for m in job.messages] == [
        ("system", "Answer briefly.", None, None),
        ("user", "Weather in Paris?", "ann", None),
        ("assistant", None, None, None),
        ("tool", "sunny, 21 C", None, "call_1"),
    ]
    assistant = job.messages[2]
    assert assistant.reasoning == "I should call the tool."  # vLLM's old name, read as the new one
    assert assistant.tool_calls is not None
    assert [(c.id, c.function.name, c.function.arguments) for c in assistant.tool_calls] == [
        ("call_1", "get_weather", '{"city": "Paris"}')
    ]
    assert job.tool_names == ["get_weather", "get_time"]
    assert job.tools[0].function.parameters == WEATHER["function"]["parameters"]
    assert job.effective_tool_choice != "auto" and job.parallel_tool_calls is False


def test_tools_without_a_choice_run_as_vllm_runs_them_auto() -> None:
    assert _chat().job_request(LIMIT).effective_tool_choice == "auto"
    assert _chat(tool_choice="none").job_request(LIMIT).effective_tool_choice == "none"


def test_the_chat_template_controls_reach_the_job() -> None:
    job = _chat(
        chat_template_kwargs={"enable_thinking": False},
        add_generation_prompt=False,
        continue_final_message=True,
        documents=[{"title": "a", "text": "b"}],
        reasoning_effort="low",
        include_reasoning=False,
        thinking_token_budget=64,
        chat_template="{{ messages }}",
    ).job_request(LIMIT)
    assert (job.chat_template_kwargs, job.add_generation_prompt, job.continue_final_message) == (
        {"enable_thinking": False},
        False,
        True,
    )
    assert (job.documents, job.reasoning_effort, job.include_reasoning, job.thinking_token_budget) == (
        [{"title": "a", "text": "b"}],
        "low",
        False,
        64,
    )
    assert job.chat_template == "{{ messages }}"


VLLM_REFUSALS: list[tuple[str, dict[str, Any], str, str | None]] = [
    (
        "empty-tools",
        {"tools": []},
        "`tools` must not be an empty array. Either provide at least one tool or omit the field entirely.",
        "tools",
    ),
    (
        "choice-without-tools",
        {"tools": None, "tool_choice": "required"},
        "When using `tool_choice`, `tools` must be set.",
        "tool_choice",
    ),
    (
        "unknown-named-tool",
        {"tool_choice": {"type": "function", "function": {"name": "get_news"}}},
        "The tool specified in `tool_choice` does not match any of the specified `tools`",
        "tool_choice",
    ),
    (
        "unknown-choice",
        {"tool_choice": "sometimes"},
        "Invalid value for `tool_choice`: sometimes! "
        'Only named tools, "none", "auto" or "required" are supported.',
        "tool_choice",
    ),
    (
        "named-choice-without-name",
        {"tool_choice": {"type": "function", "function": {}}},
        "Expected field `name` in `function` in `tool_choice`! "
        'Correct usage: `{"type": "function", "function": {"name": "my_function"}}`',
        "tool_choice.function.name",
    ),
    (
        "both-prompt-controls",
        {"add_generation_prompt": True, "continue_final_message": True},
        "Cannot set both `continue_final_message` and `add_generation_prompt` to True.",
        None,
    ),
    (
        "constraint-and-named-tool",
        {
            "structured_outputs": {"regex": "a+"},
            "tool_choice": {"type": "function", "function": {"name": "get_time"}},
        },
        "You can only either use constraints for structured outputs or tools, not both.",
        None,
    ),
    (
        "streamed-prompt-logprobs",
        {"prompt_logprobs": 1, "stream": True},
        "`prompt_logprobs` are not available when `stream=True`.",
        "prompt_logprobs",
    ),
]


@pytest.mark.parametrize(
    ("body", "message", "param"),
    [case[1:] for case in VLLM_REFUSALS],
    ids=[case[0] for case in VLLM_REFUSALS],
)
def test_what_vllm_refuses_is_refused_in_its_words(
    body: dict[str, Any], message: str, param: str | None
) -> None:
    with pytest.raises(vllm_protocol().VLLMValidationError) as vllm_refusal:
        vllm_protocol().ChatCompletionRequest.model_validate(_body(**body))
    assert message in str(vllm_refusal.value)
    with pytest.raises(InvalidRequest) as refusal:
        _chat(**body).job_request(LIMIT)
    assert (refusal.value.message, refusal.value.detail.get("param")) == (message, param)


def test_continuing_the_last_message_needs_no_generation_prompt() -> None:
    messages = [{"role": "user", "content": "Say hi"}, {"role": "assistant", "content": "Hi"}]
    with pytest.raises(InvalidRequest):
        _chat(messages=messages, continue_final_message=True).job_request(LIMIT)
    job = _chat(messages=messages, continue_final_message=True, add_generation_prompt=False).job_request(
        LIMIT
    )
    assert (job.continue_final_message, job.add_generation_prompt) == (True, False)


def test_unknown_fields_are_taken_and_named_known_ones_are_not() -> None:
    body = _chat(
        metadata={"a": "b"},
        store=True,
        service_tier="auto",
        prediction={"type": "content", "content": "x"},
        functions=[{"name": "f"}],  # OpenAI's old names, which vLLM no longer reads
        function_call="auto",
        user="someone",
        stream=True,
        stream_options={"include_usage": True, "chunk_size": 3},
    )
    assert body.ignored_fields == [
        "service_tier",
        "prediction",
        "functions",
        "function_call",
        "stream_options.chunk_size",
    ]
    assert body.job_request(LIMIT) == _chat(stream=True, stream_options={"include_usage": True}).job_request(
        LIMIT
    )
    assert _chat(user="someone").ignored_fields == []


@pytest.mark.parametrize(
    "option",
    [
        {"use_beam_search": True},
        {"bad_words": ["Paris"]},
        {"allowed_token_ids": [1, 2]},
        {"return_token_ids": True},
        {"vllm_xargs": {"a": 1}},
        {"truncation_side": "right"},
        {"add_special_tokens": True},
    ],
)
def test_vllms_options_that_jobs_cannot_honour_are_refused_not_ignored(option: dict[str, Any]) -> None:
    """vLLM's own options that would change the answer are refused, naming them; at their defaults they
    change nothing, and are taken."""
    ((name, value),) = option.items()
    with pytest.raises(InvalidRequest) as refused:
        _chat(**option).job_request(LIMIT)
    assert refused.value.detail["param"] == name
    default = {"truncation_side": "left", "add_special_tokens": False}.get(name, None)
    assert _chat(**{name: default}).job_request(LIMIT) == _chat().job_request(LIMIT)


def test_stream_options_may_be_null_as_vllm_takes_them() -> None:
    body = _chat(stream=True, stream_options={"include_usage": None, "continuous_usage_stats": None})
    assert not body.include_usage and body.stream_options is not None
    assert not body.stream_options.continuous_usage


@pytest.mark.parametrize(
    "message",
    [
        {"role": "user", "content": "x", "tool_calls": []},  # only an assistant calls tools
        {"role": "tool", "tool_call_id": "call_1"},  # a result holds content
        {"role": "assistant", "content": None},  # no content and no calls
        {"role": "assistant", "content": None, "tool_calls": [{"id": "c", "function": {"name": "f"}}]},
    ],
)
def test_messages_a_chat_cannot_hold_are_refused(message: dict[str, Any]) -> None:
    with pytest.raises(ValidationError):
        _chat(messages=[message])


ECHOES: list[tuple[dict[str, Any], str, str]] = [
    ({}, "assistant", "It is"),  # the last message is the answer's role: it goes first
    ({"messages": [{"role": "user", "content": "Hi"}]}, "assistant", ""),
    ({"messages": [{"role": "user", "content": "Hi"}], "add_generation_prompt": False}, "user", "Hi"),
]


@pytest.mark.parametrize(("fields", "role", "echoed"), ECHOES)
def test_echo_puts_the_last_message_first_when_its_role_is_the_answers(
    fields: dict[str, Any], role: str, echoed: str
) -> None:
    messages = [{"role": "user", "content": "Weather?"}, {"role": "assistant", "content": "It is"}]
    body = _chat(**{"messages": messages, "echo": True, **fields})
    assert (body.role, body.echoed) == (role, echoed)
    assert _chat(**{"messages": messages, **fields}).echoed == ""


# Answers


ANSWER = Answer(chat=True, job_id="abc", model=CARD_MODEL, created=1700000000)


def _call(index: int, arguments: str, name: str | None = None, call_id: str | None = None) -> ToolCallDelta:
    return ToolCallDelta(
        index=index,
        id=call_id,
        type="function" if call_id else None,
        function=FunctionDelta(name=name, arguments=arguments),
    )


def _tool_events() -> list[Event]:
    """A reasoning model's choice that thinks, then calls two tools, their arguments in fragments and
    interleaved, with one step its parser held back (markup), as a worker writes them."""
    return [
        DeltaEvent(seq=2, text="", reasoning="The user wants ", token_ids=[1, 2]),
        DeltaEvent(seq=3, text="", reasoning="the weather.", token_ids=[3]),
        DeltaEvent(seq=4, text="", token_ids=[4]),  # `<tool_call>`: nothing to say yet
        DeltaEvent(seq=5, text="", tool_calls=[_call(0, "", "get_weather", "call_a")], token_ids=[5]),
        DeltaEvent(
            seq=6,
            text="",
            tool_calls=[_call(0, '{"city": '), _call(1, "", "get_time", "call_b")],
            token_ids=[6],
        ),
        DeltaEvent(seq=7, text="", tool_calls=[_call(0, '"Paris"}'), _call(1, "{}")], token_ids=[7]),
        DoneEvent(seq=8, finish_reason="tool_calls", stop_reasons=[None], usage=USAGE),
    ]


def _stream(events: list[Event], answer: Answer = ANSWER, **options: Any) -> list[dict[str, Any]]:
    chunks = ChunkStream(answer, **{"include_usage": False, **options})
    return [json.loads(json.dumps(chunk)) for event in events for chunk in chunks.feed(event)]


def test_a_streamed_tool_call_is_chunked_as_vllm_streams_it() -> None:
    raw = _stream(_tool_events())
    for chunk in raw:  # both parsers take every chunk
        vllm_protocol().ChatCompletionStreamResponse.model_validate(chunk)
        ChatCompletionChunk.model_validate(chunk)
    assert all("usage" not in chunk for chunk in raw)
    deltas = [chunk["choices"][0]["delta"] for chunk in raw]
    assert deltas[:3] == [
        {"role": "assistant", "content": ""},
        {"reasoning": "The user wants "},
        {"reasoning": "the weather."},
    ]
    assert deltas[3:6] == [
        {
            "tool_calls": [
                {
                    "index": 0,
                    "id": "call_a",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": ""},
                }
            ]
        },
        {
            "tool_calls": [
                {"index": 0, "function": {"arguments": '{"city": '}},
                {
                    "index": 1,
                    "id": "call_b",
                    "type": "function",
                    "function": {"name": "get_time", "arguments": ""},
                },
            ]
        },
        {
            "tool_calls": [
                {"index": 0, "function": {"arguments": '"Paris"}'}},
                {"index": 1, "function": {"arguments": "{}"}},
            ]
        },
    ]
    last = raw[-1]["choices"][0]
    assert (last["delta"], last["finish_reason"], last["stop_reason"]) == ({}, "tool_calls", None)
    assert len(raw) == 7  # the held-back step made no chunk
    assert all("stop_reason" not in chunk["choices"][0] for chunk in raw[:-1])


def test_the_openai_stream_helper_puts_the_calls_together() -> None:
    state = ChatCompletionStreamState(input_tools=[WEATHER, TIME])  # type: ignore[list-item]
    for chunk in _stream(_tool_events()):
        state.handle_chunk(ChatCompletionChunk.model_validate(chunk))
    message = state.get_final_completion().choices[0].message
    assert message.tool_calls is not None
    assert [(c.id, c.function.name, c.function.arguments) for c in message.tool_calls] == [
        ("call_a", "get_weather", '{"city": "Paris"}'),
        ("call_b", "get_time", "{}"),
    ]


def test_usage_when_asked_for_comes_on_a_last_chunk_alone() -> None:
    raw = _stream(_tool_events(), include_usage=True)
    assert ["usage" in chunk for chunk in raw] == [False] * 7 + [True]
    assert raw[-1]["choices"] == [] and raw[-1]["usage"]["total_tokens"] == 17
    continuous = _stream(_tool_events(), include_usage=True, continuous_usage=True)
    assert all("usage" in chunk for chunk in continuous)


def test_a_stop_string_that_ended_a_choice_is_its_stop_reason() -> None:
    events: list[Event] = [
        DeltaEvent(seq=2, text="Hi", token_ids=[1]),
        DoneEvent(seq=3, finish_reason="stop", stop_reasons=["\n\n"], usage=USAGE),
    ]
    last = _stream(events)[-1]["choices"][0]
    assert (last["finish_reason"], last["stop_reason"]) == ("stop", "\n\n")


def test_a_streamed_echo_follows_the_role_chunk() -> None:
    events: list[Event] = [DeltaEvent(seq=2, text=" sunny.", token_ids=[1]), *_tool_events()[-1:]]
    raw = _stream(events, echoed="It is")
    assert [chunk["choices"][0]["delta"] for chunk in raw[:3]] == [
        {"role": "assistant", "content": ""},
        {"content": "It is"},
        {"content": " sunny."},
    ]


def _whole(body: ChatBody, events: list[Event]) -> dict[str, Any]:
    collected = Collected()
    for event in events:
        collected.add(event)
    answer: dict[str, Any] = json.loads(
        json.dumps(whole_answer(body, body.job_request(LIMIT), ANSWER, collected.result()))
    )
    vllm_protocol().ChatCompletionResponse.model_validate(answer)
    ChatCompletion.model_validate(answer)
    return answer


def test_a_whole_answer_holds_the_calls_put_together_and_the_reasoning() -> None:
    choice = _whole(_chat(), _tool_events())["choices"][0]
    assert choice["message"] == {
        "role": "assistant",
        "content": None,  # vLLM's, when an auto choice only called tools
        "tool_calls": [
            {
                "id": "call_a",
                "type": "function",
                "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
            },
            {"id": "call_b", "type": "function", "function": {"name": "get_time", "arguments": "{}"}},
        ],
        "reasoning": "The user wants the weather.",
    }
    assert (choice["finish_reason"], choice["stop_reason"]) == ("tool_calls", None)


def test_a_required_choices_calls_come_with_empty_content() -> None:
    content = _whole(_chat(tool_choice="required"), _tool_events())["choices"][0]["message"]["content"]
    assert content == ""


def test_a_whole_answer_without_calls_has_no_tool_calls_key() -> None:
    events: list[Event] = [
        DeltaEvent(seq=2, text="Sunny.", token_ids=[1]),
        DoneEvent(seq=3, finish_reason="stop", stop_reasons=[7], usage=USAGE),
    ]
    choice = _whole(_chat(tool_choice="none"), events)["choices"][0]
    assert choice["message"] == {"role": "assistant", "content": "Sunny.", "reasoning": None}
    assert choice["stop_reason"] == 7


def test_a_whole_answer_gives_the_prompt_logprobs_in_vllms_shape() -> None:
    asked = [
        None,
        TokenLogprob(
            token_id=5,
            token="Hi",
            logprob=-1.5,
            rank=2,
            top_logprobs=[TopLogprob(token_id=9, token="Yo", logprob=-0.5)],
        ),
    ]
    events: list[Event] = [
        DeltaEvent(seq=2, text="Sunny.", token_ids=[1], prompt_logprobs=asked),
        DoneEvent(seq=3, finish_reason="stop", usage=USAGE),
    ]
    answer = _whole(_chat(tool_choice="none", prompt_logprobs=1), events)
    assert answer["prompt_logprobs"] == [
        None,
        {
            "5": {"logprob": -1.5, "rank": 2, "decoded_token": "Hi"},
            "9": {"logprob": -0.5, "rank": 1, "decoded_token": "Yo"},
        },
    ]
    assert _whole(_chat(tool_choice="none"), events)["prompt_logprobs"] is None


# Admission


CARD_WITHOUT_PARSER = {"tool_call_parser": None, "trust_request_chat_template": False}


@pytest.mark.parametrize(
    ("choice", "message"),
    [
        (None, '"auto" tool choice requires --enable-auto-tool-choice and --tool-call-parser to be set'),
        ("auto", '"auto" tool choice requires --enable-auto-tool-choice and --tool-call-parser to be set'),
        ("required", 'tool_choice="required" requires --tool-call-parser to be set'),
        (
            {"type": "function", "function": {"name": "get_time"}},
            'tool_choice=function "get_time" requires --tool-call-parser to be set',
        ),
    ],
)
def test_a_tool_choice_on_a_pool_without_a_parser_is_refused_in_vllms_words(
    card: ModelCard, choice: Any, message: str
) -> None:
    job = _chat(tool_choice=choice).job_request(LIMIT)
    with pytest.raises(InvalidRequest) as refusal:
        check_pool_serves(job, card.model_copy(update=CARD_WITHOUT_PARSER))
    assert (refusal.value.message, refusal.value.detail["param"]) == (message, "tool_choice")
    check_pool_serves(job, card.model_copy(update={"tool_call_parser": "hermes"}))
    check_pool_serves(job, None)  # no card yet: the worker checks


def test_tools_without_a_choice_of_them_need_no_parser(card: ModelCard) -> None:
    check_pool_serves(
        _chat(tool_choice="none").job_request(LIMIT), card.model_copy(update=CARD_WITHOUT_PARSER)
    )


@pytest.mark.parametrize(
    "fields",
    [{"chat_template": "{{ messages }}"}, {"chat_template_kwargs": {"chat_template": "{{ messages }}"}}],
)
def test_a_chat_template_of_the_requests_own_needs_a_pool_that_trusts_it(
    card: ModelCard, fields: dict[str, Any]
) -> None:
    job = _chat(tool_choice="none", **fields).job_request(LIMIT)
    with pytest.raises(InvalidRequest) as refusal:
        check_pool_serves(job, card.model_copy(update=CARD_WITHOUT_PARSER))
    assert refusal.value.message.startswith(
        "Chat template is passed with request, but --trust-request-chat-template"
    )
    check_pool_serves(job, card.model_copy(update={"trust_request_chat_template": True}))


# Through a gateway process

PARSING_MODEL = "parsing-model"  # a pool started with a tool-call parser


@pytest.fixture(scope="module")
def gateway(redis_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[KeyedGateway]:
    yield from run_gateway(
        redis_url, tmp_path_factory.mktemp("chat-tools"), allow_unauthenticated=True, default_model=CARD_MODEL
    )


@pytest.fixture
async def http(
    gateway: KeyedGateway, card: ModelCard, redis_client: aioredis.Redis
) -> AsyncIterator[httpx.AsyncClient]:
    """The default model's pool has no tool-call parser; PARSING_MODEL's has one."""
    keys = Keys.of(gateway.settings)
    await publish_model_card(redis_client, keys, card.model_copy(update=CARD_WITHOUT_PARSER))
    parsing = card.model_copy(update={"model": PARSING_MODEL, "tool_call_parser": "hermes"})
    await publish_model_card(redis_client, keys, parsing)
    await heartbeat(redis_client, keys, "stand-in", CARD_MODEL)
    await heartbeat(redis_client, keys, "stand-in-parsing", PARSING_MODEL)
    async with httpx.AsyncClient(base_url=gateway.base_url, timeout=60) as client:

        async def known() -> bool:
            listed = (await client.get("/v1/models")).json()["data"]
            return PARSING_MODEL in [model["id"] for model in listed]

        await eventually(known, f"the gateway knows {PARSING_MODEL}")  # it reads the workers once a second
        yield client


async def _submitted(http: httpx.AsyncClient) -> float:
    return (await scrape(http)).value("streampool_jobs_submitted_total")


async def test_a_pool_without_a_parser_refuses_tools_before_any_job(http: httpx.AsyncClient) -> None:
    before = await _submitted(http)
    answer = await http.post("/v1/chat/completions", json=_body())
    assert answer.status_code == 400, answer.text
    assert answer.json()["error"]["param"] == "tool_choice"
    assert answer.json()["error"]["message"].startswith(
        '"auto" tool choice requires --enable-auto-tool-choice'
    )
    native = {"messages": ASK, "tools": [WEATHER], "tool_choice": "required", "max_tokens": 8}
    answer = await http.post("/v1/jobs", json=native)
    assert answer.status_code == 422, answer.text
    assert "--tool-call-parser" in answer.text
    assert await _submitted(http) == before


async def test_vllms_refusals_make_no_job(http: httpx.AsyncClient) -> None:
    before = await _submitted(http)
    for _, fields, message, param in VLLM_REFUSALS:
        answer = await http.post("/v1/chat/completions", json=_body(model=PARSING_MODEL, **fields))
        assert answer.status_code == 400, answer.text
        assert answer.json()["error"]["message"] == message and answer.json()["error"]["param"] == param
    assert await _submitted(http) == before


async def _publish(
    redis_client: aioredis.Redis, settings: Settings, job_id: str, events: list[Event]
) -> None:
    keys = Keys.of(settings)
    for event in events:
        await redis_client.xadd(keys.stream(job_id), {"type": event.type, "data": event.model_dump_json()})
    await notify(redis_client, keys, keys.stream(job_id))


async def test_a_pool_with_a_parser_streams_its_calls_and_names_the_fields_it_ignored(
    http: httpx.AsyncClient, gateway: KeyedGateway, redis_client: aioredis.Redis
) -> None:
    body = _body(
        model=PARSING_MODEL, messages=ASK, stream=True, metadata={"run": "1"}, store=False, frobnicate=1
    )
    state = ChatCompletionStreamState(input_tools=[WEATHER, TIME])  # type: ignore[list-item]
    async with http.stream("POST", "/v1/chat/completions", json=body) as response:
        assert response.status_code == 200, await response.aread()
        assert response.headers["X-Streampool-Ignored-Fields"] == "frobnicate"
        await _publish(
            redis_client, gateway.settings, response.headers["X-Streampool-Job-Id"], _tool_events()
        )
        async for line in response.aiter_lines():
            if line.startswith("data: {"):
                state.handle_chunk(ChatCompletionChunk.model_validate_json(line.removeprefix("data: ")))
    choice = state.get_final_completion().choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.tool_calls is not None
    assert [c.function.name for c in choice.message.tool_calls] == ["get_weather", "get_time"]
