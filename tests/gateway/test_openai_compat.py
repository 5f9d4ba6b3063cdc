"""OpenAI compatibility without Redis or a worker: request mapping, answers and chunks, error shapes.

Answers and chunks are parsed with the `openai` package's own models, as its client parses them.
The last tests run the gateway app in-process, pointed at a port where no Redis answers:
everything they check is decided before a job would reach Redis.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from openai.types import Completion
from openai.types.chat import ChatCompletion, ChatCompletionChunk
from pydantic import ValidationError

from gateway.compat.openai_answers import (
    Answer,
    ChoiceOutput,
    ChunkStream,
    PromptEcho,
    chat_logprobs,
    completion,
    completion_logprobs,
)
from gateway.compat.openai_bodies import ChatBody, CompletionBody
from gateway.routes.openai import OPENAI_ERRORS
from shared.errors import (
    BackendUnavailable,
    EngineError,
    InvalidRequest,
    JobCancelled,
    ModelNotFound,
    Overloaded,
    PromptTooLong,
    StreampoolError,
)
from shared.events import (
    DeltaEvent,
    DoneEvent,
    Echo,
    Event,
    JobState,
    StatusEvent,
    TokenLogprob,
    TopLogprob,
    Usage,
)
from shared.requests import JobRequest
from tests.conftest import make_settings
from tests.helpers import in_process_gateway
from tests.processes import free_port
from tests.vllm_protocol import vllm_protocol

LIMIT = 2048
MODEL = "SmolLM2-135M-Instruct"
CHAT = [{"role": "user", "content": "Hi"}]


def _completion(**body: Any) -> CompletionBody:
    return CompletionBody.model_validate({"model": MODEL, "prompt": "Once", **body})


def _chat(**body: Any) -> ChatBody:
    return ChatBody.model_validate({"model": MODEL, "messages": CHAT, **body})


def _refusal(body: CompletionBody | ChatBody) -> InvalidRequest:
    with pytest.raises(InvalidRequest) as caught:
        body.job_request(LIMIT)
    return caught.value


# Request mapping


def test_completion_sampling_options_reach_the_job() -> None:
    job = _completion(
        max_tokens=7, temperature=0.5, top_p=0.9, top_k=40, seed=3, stop=["\n", "."], logprobs=2
    ).job_request(LIMIT)
    assert (job.prompt, job.messages, job.max_tokens, job.temperature, job.top_p) == (
        "Once",
        None,
        7,
        0.5,
        0.9,
    )
    assert (job.top_k, job.seed, job.stop_strings, job.logprobs) == (40, 3, ["\n", "."], 2)


def test_completion_defaults_to_16_tokens_and_the_limit_caps_the_default() -> None:
    assert _completion().job_request(LIMIT).max_tokens == 16
    assert _completion().job_request(8).max_tokens == 8


@pytest.mark.parametrize("top_k", [-1, 0])
def test_top_k_of_minus_one_or_zero_means_no_limit_as_in_vllm(top_k: int) -> None:
    assert _completion(top_k=top_k).job_request(LIMIT).top_k is None


def test_completion_prompt_may_be_a_list_of_one_string() -> None:
    assert _completion(prompt=["Once upon"]).job_request(LIMIT).prompt == "Once upon"


@pytest.mark.parametrize(
    ("prompt", "job_fields"),
    [
        ([504, 3575, 282], {"prompt_token_ids": [504, 3575, 282]}),
        ([[504, 3575]], {"prompt_token_ids": [504, 3575]}),
        ([[504], [3575, 282]], {"prompt_token_ids": [[504], [3575, 282]]}),
        (["Once", "upon"], {"prompt": ["Once", "upon"]}),
    ],
)
def test_token_ids_and_lists_of_prompts_become_the_jobs_prompts(
    prompt: Any, job_fields: dict[str, Any]
) -> None:
    job = _completion(prompt=prompt, n=2).job_request(LIMIT)
    assert job.model_dump(include=set(job_fields)) == job_fields
    assert job.choices == 2 * job.prompt_count


@pytest.mark.parametrize(("prompt", "param"), [([], "prompt"), ([1, -2], "prompt"), ([[1], []], "prompt")])
def test_an_empty_prompt_or_a_negative_token_id_is_refused_naming_the_prompt(prompt: Any, param: str) -> None:
    assert _refusal(_completion(prompt=prompt)).detail["param"] == param


@pytest.mark.parametrize("prompt", ["Once", [1, 2, 3], [[1, 2, 3]], ["a", "b"], [[1, 2], [3]]])
def test_echo_asks_the_job_for_its_prompt_and_with_logprobs_for_the_prompts_as_vllm_asks_its_engine(
    prompt: Any,
) -> None:
    job = _completion(prompt=prompt, echo=True, logprobs=2).job_request(LIMIT)
    assert (job.echo, job.logprobs, job.prompt_logprobs) == (True, 2, 2)
    assert (
        _completion(prompt=prompt, echo=True, logprobs=2, prompt_logprobs=0)
        .job_request(LIMIT)
        .prompt_logprobs
        == 0
    )
    assert _completion(prompt=prompt, echo=True).job_request(LIMIT).prompt_logprobs is None
    assert not _completion(prompt=prompt).job_request(LIMIT).echo
    with pytest.raises(ValidationError, match="echo"):  # a chat's echo is the gateway's, from its body
        JobRequest(messages=CHAT, echo=True)


def test_an_echo_of_max_tokens_0_runs_one_token_and_gives_the_prompt_back_alone() -> None:
    body = _completion(echo=True, max_tokens=0)
    assert body.prompt_echo is PromptEcho.alone and body.job_request(LIMIT).max_tokens == 1
    assert _completion(echo=True).prompt_echo is PromptEcho.before
    assert _completion().prompt_echo is PromptEcho.none and _chat(echo=True).prompt_echo is PromptEcho.none
    assert _refusal(_completion(max_tokens=0)).detail["param"] == "max_tokens"


def test_chat_text_parts_are_joined_and_developer_is_system() -> None:
    messages = [
        {"role": "developer", "content": "Be brief."},
        {"role": "user", "content": [{"type": "text", "text": "one"}, {"type": "text", "text": "two"}]},
        {"role": "assistant", "content": "ok"},
    ]
    job = _chat(messages=messages).job_request(LIMIT)
    assert job.prompt is None and job.messages is not None
    assert [(m.role, m.content) for m in job.messages] == [
        ("system", "Be brief."),
        ("user", "one\ntwo"),
        ("assistant", "ok"),
    ]


def test_chat_without_max_tokens_gets_the_native_default() -> None:
    assert _chat().job_request(LIMIT).max_tokens == 256


def test_chat_max_completion_tokens_wins_over_max_tokens_and_is_the_one_named() -> None:
    assert _chat(max_tokens=9, max_completion_tokens=5).job_request(LIMIT).max_tokens == 5
    error = _refusal(_chat(max_tokens=9, max_completion_tokens=0))
    assert error.detail["param"] == "max_completion_tokens"


@pytest.mark.parametrize(
    ("options", "job_logprobs"),
    [({}, None), ({"logprobs": True}, 0), ({"logprobs": True, "top_logprobs": 3}, 3)],
)
def test_chat_logprobs_and_top_logprobs_become_the_job_logprobs(
    options: dict[str, Any], job_logprobs: int | None
) -> None:
    assert _chat(**options).job_request(LIMIT).logprobs == job_logprobs


VLLM_OPTIONS: dict[str, Any] = {
    "presence_penalty": 0.5,
    "frequency_penalty": -1,
    "repetition_penalty": 1.2,
    "logit_bias": {"50256": -100, "7": 2.5},
    "min_p": 0.05,
    "min_tokens": 3,
    "ignore_eos": True,
    "stop_token_ids": [2],
    "include_stop_str_in_output": True,
    "skip_special_tokens": False,
    "spaces_between_special_tokens": False,
}


@pytest.mark.parametrize("kind", ["completion", "chat"])
def test_vllm_sampling_options_reach_the_job_under_their_names(kind: str) -> None:
    body = _chat(**VLLM_OPTIONS) if kind == "chat" else _completion(**VLLM_OPTIONS)
    job = body.job_request(LIMIT)
    assert job.model_dump(include=set(VLLM_OPTIONS)) == VLLM_OPTIONS


@pytest.mark.parametrize(
    ("options", "param"),
    [
        ({"logit_bias": {"5": 101}}, "logit_bias"),
        ({"logit_bias": {"not a token": 1}}, "logit_bias"),
        ({"logit_bias": {str(token): 1 for token in range(301)}}, "logit_bias"),
        ({"presence_penalty": 2.5}, "presence_penalty"),
        ({"frequency_penalty": -3}, "frequency_penalty"),
        ({"repetition_penalty": 0}, "repetition_penalty"),
        ({"min_p": 1.5}, "min_p"),
        ({"min_tokens": 17}, "min_tokens"),  # above the default max_tokens of 16
        ({"min_tokens": -1}, "min_tokens"),
        ({"stop_token_ids": [-1]}, "stop_token_ids"),
    ],
)
def test_vllm_sampling_option_out_of_bounds_is_refused_by_name(options: dict[str, Any], param: str) -> None:
    error = _refusal(_completion(**options))
    assert error.detail["param"] == param


SCHEMA = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}


@pytest.mark.parametrize(
    ("options", "constraint"),
    [
        ({"response_format": {"type": "json_object"}}, {"json_object": True}),
        (
            {"response_format": {"type": "json_schema", "json_schema": {"name": "c", "schema": SCHEMA}}},
            {"json": SCHEMA},
        ),
        ({"structured_outputs": {"regex": "[0-9]+"}}, {"regex": "[0-9]+"}),
        ({"structured_outputs": {"choice": ["yes", "no"]}}, {"choice": ["yes", "no"]}),
        (
            {
                "response_format": {"type": "json_object"},
                "structured_outputs": {"regex": "x", "disable_any_whitespace": True},
            },
            {"json_object": True, "disable_any_whitespace": True},
        ),
    ],
)
@pytest.mark.parametrize("kind", ["completion", "chat"])
def test_structured_output_reaches_the_job_as_vllm_builds_it(
    kind: str, options: dict[str, Any], constraint: dict[str, Any]
) -> None:
    body = _chat(**options) if kind == "chat" else _completion(**options)
    job = body.job_request(LIMIT)
    assert job.structured_outputs is not None
    given = job.structured_outputs.model_dump(exclude_none=True, exclude_defaults=True)
    assert given == constraint


def test_text_response_format_sets_no_constraint() -> None:
    assert _chat(response_format={"type": "text"}).job_request(LIMIT).structured_outputs is None


def test_two_structured_output_constraints_are_refused_by_name() -> None:
    error = _refusal(_completion(structured_outputs={"regex": "x", "choice": ["a"]}))
    assert error.detail["param"] == "structured_outputs"


def test_truncate_prompt_tokens_reaches_the_job() -> None:
    assert _completion(truncate_prompt_tokens=5).job_request(LIMIT).truncate_prompt_tokens == 5
    assert _refusal(_completion(truncate_prompt_tokens=-2)).detail["param"] == "truncate_prompt_tokens"


ECHO = Echo(text="Once upon", first_token="Once")
PROMPT_LOGPROBS = [None, TokenLogprob(token_id=7, token=" upon", logprob=-3.0, rank=2)]
OUTPUT_LOGPROBS = [TokenLogprob(token_id=8, token=" a", logprob=-0.5, rank=1)]


def _echo_stream(prompt_echo: PromptEcho, events: list[DeltaEvent]) -> list[dict[str, Any]]:
    stream = ChunkStream(
        Answer(chat=False, job_id="j", model=MODEL, created=1), False, prompt_echo=prompt_echo
    )
    return [chunk for event in events for chunk in stream.feed(event)]


def test_echo_puts_the_prompt_the_job_gives_back_before_the_completion_streamed() -> None:
    first = DeltaEvent(seq=2, text=" a", token_ids=[8], echo=ECHO)
    second = DeltaEvent(seq=3, text=" time", token_ids=[9])
    chunks = _echo_stream(PromptEcho.before, [first, second])
    assert [chunk["choices"][0]["text"] for chunk in chunks] == ["Once upon a", " time"]
    # Two prompts of two choices each: each choice opens with its own prompt, which the first delta
    # of the prompt's first choice carries.
    stream = ChunkStream(
        Answer(chat=False, job_id="j", model=MODEL, created=1),
        False,
        prompt_echo=PromptEcho.before,
        choices_per_prompt=2,
    )
    other = Echo(text="Hi", first_token="Hi")
    opening = [
        DeltaEvent(seq=2, text=" a", token_ids=[8], echo=ECHO),
        DeltaEvent(seq=3, index=1, text=" b", token_ids=[8]),
        DeltaEvent(seq=4, index=2, text=" c", token_ids=[8], echo=other),
        DeltaEvent(seq=5, index=3, text=" d", token_ids=[8]),
    ]
    texts = [chunk["choices"][0]["text"] for event in opening for chunk in stream.feed(event)]
    assert texts == ["Once upon a", "Once upon b", "Hi c", "Hi d"]
    assert [chunk["choices"][0]["text"] for chunk in _echo_stream(PromptEcho.none, [first, second])] == [
        " a",
        " time",
    ]
    assert [chunk["choices"][0]["text"] for chunk in _echo_stream(PromptEcho.alone, [first])] == ["Once upon"]


def test_echoed_logprobs_list_the_prompts_tokens_first_with_none_for_the_first_as_vllm_does() -> None:
    """Whole and streamed: the prompt's first token has no logprob and no alternatives; offsets count
    on through the prompt into the output, and into a stream's next chunk."""
    first = DeltaEvent(
        seq=2, text=" a", token_ids=[8], logprobs=OUTPUT_LOGPROBS, prompt_logprobs=PROMPT_LOGPROBS, echo=ECHO
    )
    later = TokenLogprob(token_id=9, token=" time", logprob=-1.0, rank=1)
    chunks = _echo_stream(
        PromptEcho.before, [first, DeltaEvent(seq=3, text=" time", token_ids=[9], logprobs=[later])]
    )
    for chunk in chunks:
        vllm_protocol().CompletionStreamResponse.model_validate(chunk)
    echoed, after = (chunk["choices"][0]["logprobs"] for chunk in chunks)
    assert echoed == {
        "tokens": ["Once", " upon", " a"],
        "token_logprobs": [None, -3.0, -0.5],
        "top_logprobs": [None, {" upon": -3.0}, {" a": -0.5}],
        "text_offset": [0, 4, 9],
    }
    assert (after["tokens"], after["text_offset"]) == ([" time"], [11])
    answer = Answer(chat=False, job_id="abc", model=MODEL, created=1700000000)
    output = ChoiceOutput(" a", OUTPUT_LOGPROBS, "length", prompt_logprobs=PROMPT_LOGPROBS, echo=ECHO)
    whole = json.loads(json.dumps(completion(answer, [output], USAGE)))
    # vLLM's model and not the openai package's, whose types have no null logprob: its client reads
    # answers without validating them, and vLLM's server answers the same nulls.
    vllm_protocol().CompletionResponse.model_validate(whole)
    assert whole["choices"][0]["text"] == "Once upon a"
    assert whole["choices"][0]["logprobs"] == echoed
    alone = ChoiceOutput("", [], "length", prompt_logprobs=PROMPT_LOGPROBS, echo=ECHO)
    logprobs = completion(answer, [alone], USAGE)["choices"][0]["logprobs"]
    assert (logprobs["tokens"], logprobs["token_logprobs"]) == (["Once", " upon"], [None, -3.0])


UNSUPPORTED: list[tuple[str, dict[str, Any], str]] = [
    ("completion", {"best_of": 2}, "best_of"),
    ("completion", {"guided_json": {"type": "object"}}, "guided_json"),
    ("chat", {"guided_choice": ["a", "b"]}, "guided_choice"),
    ("chat", {"response_format": {"type": "structural_tag", "structures": []}}, "response_format"),
    ("chat", {"response_format": {"type": "json_schema", "json_schema": {"name": "x"}}}, "response_format"),
    ("completion", {"suffix": "end"}, "suffix"),
    ("chat", {"top_logprobs": 2}, "top_logprobs"),
    ("completion", {"stream_options": {"include_usage": True}}, "stream_options"),
]


@pytest.mark.parametrize(
    ("kind", "options", "param"), UNSUPPORTED, ids=[param for _, _, param in UNSUPPORTED]
)
def test_unsupported_option_is_refused_with_its_parameter_named(
    kind: str, options: dict[str, Any], param: str
) -> None:
    body = _chat(**options) if kind == "chat" else _completion(**options)
    error = _refusal(body)
    assert error.detail == {"param": param, "code": "unsupported_parameter"}
    assert error.message.startswith(f"{param}: ")


def test_harmless_options_are_accepted() -> None:
    harmless = {
        "n": 1,
        "presence_penalty": 0,
        "frequency_penalty": 0.0,
        "logit_bias": {},
        "user": "someone",
        "tool_choice": "none",
        "parallel_tool_calls": False,
        "response_format": {"type": "text"},
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    body = _chat(**harmless)
    assert body.job_request(LIMIT).messages is not None
    assert body.include_usage


def test_null_options_mean_their_defaults() -> None:
    nulls = dict.fromkeys(["n", "presence_penalty", "frequency_penalty", "stream", "logit_bias", "seed"])
    assert _completion(**nulls, echo=None).job_request(LIMIT) == _completion().job_request(LIMIT)
    assert _chat(**nulls, logprobs=None).job_request(LIMIT) == _chat().job_request(LIMIT)


@pytest.mark.parametrize(
    "body",
    [
        {"model": MODEL, "messages": [{"role": "user"}]},  # content is only optional with tool calls
        {"model": MODEL, "messages": [{"role": "assistant", "content": None}]},
        {"model": MODEL, "messages": [{"role": "user", "content": "x", "tool_calls": []}]},
        {"model": MODEL, "messages": [{"role": "critic", "content": "x"}]},
        {"model": MODEL, "messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]},
    ],
)
def test_bodies_a_job_cannot_take_fail_validation(body: dict[str, Any]) -> None:
    model = ChatBody if "messages" in body else CompletionBody
    with pytest.raises(ValidationError):
        model.model_validate(body)


@pytest.mark.parametrize(
    ("body", "param"),
    [
        (_completion(temperature=3.5), "temperature"),
        (_completion(seed=-1), "seed"),
        (_completion(n=0), "n"),
        (_chat(n=65), "n"),
        (_chat(n=2, temperature=0), "n"),  # greedy choices would all be one, as vLLM refuses
        (_completion(prompt=""), "prompt"),
        (_completion(logprobs=50), "logprobs"),
        (_chat(logprobs=True, top_logprobs=50), "top_logprobs"),
        (_completion(stop=""), "stop"),
    ],
)
def test_job_validation_errors_name_the_openai_parameter(body: CompletionBody | ChatBody, param: str) -> None:
    error = _refusal(body)
    assert error.detail["param"] == param
    assert error.message.startswith(f"{param}: ")


@pytest.mark.parametrize(
    "body, param",
    [
        (_completion(max_tokens=LIMIT + 1), "max_tokens"),
        (_chat(max_completion_tokens=LIMIT + 1), "max_completion_tokens"),
        (_chat(max_tokens=LIMIT + 1), "max_tokens"),
    ],
)
def test_a_job_field_admission_refuses_is_named_as_the_endpoint_names_it(
    body: CompletionBody | ChatBody, param: str
) -> None:
    refusal = InvalidRequest.of_field("max_tokens", f"must be at most {LIMIT}")
    error = body.in_own_terms(refusal)
    assert error.detail == {"param": param, "code": "invalid_value"}
    assert error.message == f"{param}: must be at most {LIMIT}"


def test_a_refusal_of_no_job_field_keeps_its_own_terms() -> None:
    refusal = InvalidRequest("something else")
    assert _completion().in_own_terms(refusal) is refusal


# Answers and chunks


def _logprob(token: str, logprob: float, *alternatives: tuple[str, float]) -> TokenLogprob:
    top = [TopLogprob(token_id=i, token=t, logprob=lp) for i, (t, lp) in enumerate(alternatives)]
    return TokenLogprob(token_id=99, token=token, logprob=logprob, top_logprobs=top)


USAGE = Usage(prompt_tokens=5, completion_tokens=2)


def test_completion_answer_parses_as_an_openai_completion() -> None:
    answer = Answer(chat=False, job_id="abc", model=MODEL, created=1700000000)
    parsed = Completion.model_validate(completion(answer, [ChoiceOutput("Hello", None, "length")], USAGE))
    assert (parsed.id, parsed.object, parsed.model, parsed.created) == (
        "cmpl-abc",
        "text_completion",
        MODEL,
        1700000000,
    )
    assert [(c.index, c.text, c.logprobs, c.finish_reason) for c in parsed.choices] == [
        (0, "Hello", None, "length")
    ]
    assert parsed.usage is not None and parsed.usage.total_tokens == 7


def test_answer_of_several_choices_lists_each_with_its_index() -> None:
    answer = Answer(chat=True, job_id="abc", model=MODEL, created=1700000000)
    choices = [ChoiceOutput("A", None, "stop"), ChoiceOutput("B", None, "length"), ChoiceOutput("C")]
    parsed = ChatCompletion.model_validate(completion(answer, choices, USAGE))
    assert [(c.index, c.message.content, c.finish_reason) for c in parsed.choices] == [
        (0, "A", "stop"),
        (1, "B", "length"),
        (2, "C", "stop"),
    ]


def test_n_goes_into_the_job() -> None:
    assert _chat(n=3).job_request(LIMIT).n == 3 and _completion().job_request(LIMIT).n == 1


def test_chat_answer_parses_as_an_openai_chat_completion_with_logprobs() -> None:
    answer = Answer(chat=True, job_id="abc", model=MODEL, created=1700000000)
    logprobs = [_logprob("Hi", -0.25, ("Hi", -0.25), ("Hey", -1.5))]
    parsed = ChatCompletion.model_validate(completion(answer, [ChoiceOutput("Hi", logprobs, "stop")], USAGE))
    assert (parsed.id, parsed.object) == ("chatcmpl-abc", "chat.completion")
    choice = parsed.choices[0]
    assert (choice.message.role, choice.message.content, choice.finish_reason) == ("assistant", "Hi", "stop")
    assert choice.logprobs is not None and choice.logprobs.content is not None
    token = choice.logprobs.content[0]
    assert (token.token, token.logprob, token.bytes) == ("Hi", -0.25, [72, 105])
    assert [(top.token, top.logprob) for top in token.top_logprobs] == [("Hi", -0.25), ("Hey", -1.5)]


def _events(*deltas: DeltaEvent) -> list[Event]:
    queued = StatusEvent(seq=0, state=JobState.queued)
    running = StatusEvent(seq=1, state=JobState.running)
    done = DoneEvent(seq=2 + len(deltas), finish_reason="stop", usage=USAGE)
    return [queued, running, *deltas, done]


def _delta(seq: int, text: str, logprobs: list[TokenLogprob] | None = None) -> DeltaEvent:
    return DeltaEvent(seq=seq, text=text, token_ids=[seq] * max(len(logprobs or []), 1), logprobs=logprobs)


def _stream(answer: Answer, include_usage: bool, events: list[Event]) -> list[dict[str, Any]]:
    chunks = ChunkStream(answer, include_usage)
    # Through JSON, as the client sees them.
    return [json.loads(json.dumps(chunk)) for event in events for chunk in chunks.feed(event)]


def test_chat_stream_opens_with_the_role_then_content_then_the_finish_reason() -> None:
    answer = Answer(chat=True, job_id="abc", model=MODEL, created=1700000000)
    raw = _stream(answer, False, _events(_delta(2, "Hel"), _delta(3, "lo")))
    chunks = [ChatCompletionChunk.model_validate(chunk) for chunk in raw]
    assert {(c.id, c.object, c.model) for c in chunks} == {("chatcmpl-abc", "chat.completion.chunk", MODEL)}
    deltas = [
        (c.choices[0].delta.role, c.choices[0].delta.content, c.choices[0].finish_reason) for c in chunks
    ]
    assert deltas == [("assistant", "", None), (None, "Hel", None), (None, "lo", None), (None, None, "stop")]
    assert all("usage" not in chunk for chunk in raw)


def test_stream_of_several_choices_opens_goes_on_and_ends_each_by_index() -> None:
    """Interleaved deltas of two choices: a role chunk before each one's first content, a final chunk
    per choice with its own finish_reason, usage over both."""
    answer = Answer(chat=True, job_id="abc", model=MODEL, created=1700000000)
    deltas = [
        DeltaEvent(seq=2, index=1, text="B", token_ids=[7]),
        DeltaEvent(seq=3, text="A", token_ids=[8, 9]),
        DeltaEvent(seq=4, index=1, text="b", token_ids=[10]),
    ]
    done = DoneEvent(seq=5, finish_reason="length", finish_reasons=["length", "stop"], usage=USAGE)
    raw = _stream(answer, True, [*deltas, done])
    chunks = [ChatCompletionChunk.model_validate(chunk) for chunk in raw]
    steps = [
        (c.choices[0].index, c.choices[0].delta.role, c.choices[0].delta.content, c.choices[0].finish_reason)
        for c in chunks[:-1]
    ]
    assert steps == [
        (1, "assistant", "", None),
        (1, None, "B", None),
        (0, "assistant", "", None),
        (0, None, "A", None),
        (1, None, "b", None),
        (0, None, None, "length"),
        (1, None, None, "stop"),
    ]
    assert chunks[-1].choices == [] and chunks[-1].usage is not None
    assert (chunks[-1].usage.prompt_tokens, chunks[-1].usage.completion_tokens) == (5, 2)


def test_continuous_usage_counts_the_tokens_of_every_choice() -> None:
    stream = ChunkStream(Answer(chat=False, job_id="j", model=MODEL, created=1), True, continuous_usage=True)
    stream.feed(DeltaEvent(seq=2, text="a", token_ids=[1, 2]))
    (chunk,) = stream.feed(DeltaEvent(seq=3, index=2, text="c", token_ids=[3]))
    assert chunk["choices"][0]["index"] == 2 and chunk["usage"]["completion_tokens"] == 3


def test_include_usage_adds_a_last_chunk_with_no_choices_and_no_usage_key_before() -> None:
    """As vLLM streams it: only the last chunk has `usage`, the others not even a null one."""
    answer = Answer(chat=True, job_id="abc", model=MODEL, created=1700000000)
    raw = _stream(answer, True, _events(_delta(2, "Hel")))
    chunks = [ChatCompletionChunk.model_validate(chunk) for chunk in raw]
    assert ["usage" in chunk for chunk in raw] == [False, False, False, True]
    assert chunks[-2].choices[0].finish_reason == "stop"
    assert chunks[-1].choices == []
    assert chunks[-1].usage is not None
    assert (chunks[-1].usage.prompt_tokens, chunks[-1].usage.completion_tokens) == (5, 2)
    assert chunks[-1].usage.total_tokens == 7


def test_completion_stream_chunks_carry_text_and_logprob_offsets_continue() -> None:
    # The `openai` client reads these chunks as `Completion`s without validating them
    # (a streamed `finish_reason` is null until the end), so their shape is checked here.
    answer = Answer(chat=False, job_id="abc", model=MODEL, created=1700000000)
    first = _delta(2, "Hello", [_logprob("Hel", -0.5), _logprob("lo", -0.25)])
    second = _delta(3, " you", [_logprob(" you", -1.0)])
    chunks = _stream(answer, False, _events(first, second))
    assert {(c["id"], c["object"], c["model"], c["created"]) for c in chunks} == {
        ("cmpl-abc", "text_completion", MODEL, 1700000000)
    }
    choices = [chunk["choices"] for chunk in chunks]
    assert [[(c["index"], c["text"], c["finish_reason"]) for c in cs] for cs in choices] == [
        [(0, "Hello", None)],
        [(0, " you", None)],
        [(0, "", "stop")],
    ]
    logprobs = [cs[0]["logprobs"] for cs in choices]
    assert [lp["text_offset"] for lp in logprobs[:2]] == [[0, 3], [5]]
    assert [lp["tokens"] for lp in logprobs[:2]] == [["Hel", "lo"], [" you"]]
    assert logprobs[2] is None


def test_completion_top_logprobs_always_hold_the_sampled_token() -> None:
    logprobs = completion_logprobs([_logprob("b", -3.0, ("a", -0.1)), _logprob("a", -0.1, ("a", -0.1))], 10)
    assert logprobs == {
        "tokens": ["b", "a"],
        "token_logprobs": [-3.0, -0.1],
        "top_logprobs": [{"a": -0.1, "b": -3.0}, {"a": -0.1}],
        "text_offset": [10, 11],
    }


def test_logprobs_of_minus_infinity_are_clamped_for_json() -> None:
    content = chat_logprobs([_logprob("x", float("-inf"), ("y", float("-inf")))])["content"]
    assert content[0]["logprob"] == content[0]["top_logprobs"][0]["logprob"] == -9999.0
    assert json.loads(json.dumps(content)) == content


# Errors


@pytest.mark.parametrize(
    ("exc", "status", "kind", "param", "code"),
    [
        (
            InvalidRequest("n: no", param="n", code="unsupported_parameter"),
            400,
            "invalid_request_error",
            "n",
            "unsupported_parameter",
        ),
        (
            ModelNotFound("no such model", param="model"),
            404,
            "invalid_request_error",
            "model",
            "model_not_found",
        ),
        (
            PromptTooLong("prompt has 3001 tokens"),
            400,
            "invalid_request_error",
            None,
            "context_length_exceeded",
        ),
        (JobCancelled("the job was cancelled"), 410, "invalid_request_error", None, "cancelled"),
        (Overloaded("queue full"), 429, "rate_limit_error", None, "overloaded"),
        (BackendUnavailable("Redis is unreachable"), 503, "server_error", None, "unavailable"),
        (
            EngineError("the worker stopped the job", code="worker_stopped"),
            500,
            "server_error",
            None,
            "worker_stopped",
        ),
    ],
)
def test_failures_map_to_openai_status_type_and_code(
    exc: StreampoolError, status: int, kind: str, param: str | None, code: str
) -> None:
    assert OPENAI_ERRORS.failure(exc) == (
        status,
        {"error": {"message": exc.message, "type": kind, "param": param, "code": code}},
    )


@pytest.fixture
async def gateway() -> AsyncIterator[httpx.AsyncClient]:
    """The app in-process, with its Redis at a port where nothing answers."""
    settings = make_settings(f"redis://127.0.0.1:{free_port()}/0", allow_unauthenticated=True)
    async with in_process_gateway(settings) as http:
        yield http


def _openai_error(answer: httpx.Response) -> dict[str, Any]:
    body = answer.json()
    assert set(body) == {"error"} and set(body["error"]) == {"message", "type", "param", "code"}, body
    error: dict[str, Any] = body["error"]
    return error


async def test_refused_option_answers_an_openai_400_naming_it(gateway: httpx.AsyncClient) -> None:
    answer = await gateway.post("/v1/chat/completions", json={"model": MODEL, "messages": CHAT, "n": 9})
    assert answer.status_code == 400
    error = _openai_error(answer)
    assert (error["type"], error["param"]) == ("invalid_request_error", "n")


@pytest.mark.parametrize(
    ("content", "param"),
    [
        (json.dumps({"model": MODEL, "prompt": "hi", "temperature": "warm"}), "temperature"),
        (json.dumps({"prompt": "hi"}), "model"),
        ("{not json", None),
    ],
)
async def test_invalid_body_answers_an_openai_400(
    gateway: httpx.AsyncClient, content: str, param: str | None
) -> None:
    answer = await gateway.post(
        "/v1/completions", content=content, headers={"Content-Type": "application/json"}
    )
    assert answer.status_code == 400
    assert _openai_error(answer)["param"] == param


async def test_redis_down_answers_an_openai_503_with_retry_after(gateway: httpx.AsyncClient) -> None:
    answer = await gateway.post("/v1/completions", json={"model": MODEL, "prompt": "hi"})
    assert answer.status_code == 503
    assert int(answer.headers["Retry-After"]) >= 1
    assert _openai_error(answer)["type"] == "server_error"


async def test_wrong_method_answers_in_openai_shape(gateway: httpx.AsyncClient) -> None:
    answer = await gateway.get("/v1/completions")  # GET /v1/chat/completions lists stored ones
    assert answer.status_code == 405
    assert _openai_error(answer)["type"] == "invalid_request_error"


async def test_native_routes_keep_their_error_shape(gateway: httpx.AsyncClient) -> None:
    answer = await gateway.post("/v1/jobs", json={"prompt": "hi", "n": 9})  # over max_choices
    assert answer.status_code == 422
    assert answer.json()["error_type"] == "validation"
    answer = await gateway.get(f"/v1/jobs/{uuid.uuid4().hex}")  # a well-formed id, so Redis is asked
    assert answer.status_code == 503
    assert answer.json()["error_type"] == "unavailable"


def test_completion_chunks_carry_stop_reason_as_vllm_streams_them() -> None:
    """Every chunk of a completion has `stop_reason` (null until the end); the last says which stop
    string ended the choice. vLLM's own chunk model takes each."""
    answer = Answer(chat=False, job_id="abc", model=MODEL, created=1700000000)
    done = DoneEvent(seq=3, finish_reason="stop", stop_reasons=["."], usage=USAGE)
    chunks = _stream(answer, False, [_delta(2, "Hi"), done])
    for chunk in chunks:
        vllm_protocol().CompletionStreamResponse.model_validate(chunk)
    assert [chunk["choices"][0]["stop_reason"] for chunk in chunks] == [None, "."]
    assert all("usage" not in chunk for chunk in chunks)


def test_a_whole_completion_has_each_choices_stop_reason_and_prompt_logprobs() -> None:
    answer = Answer(chat=False, job_id="abc", model=MODEL, created=1700000000)
    prompt_logprobs = [None, TokenLogprob(token_id=5, token="Once", logprob=-2.0, rank=3)]
    choices = [
        ChoiceOutput("Hello", None, "stop", stop_reason=2, prompt_logprobs=prompt_logprobs),
        ChoiceOutput("Hi", None, "length"),
    ]
    whole = json.loads(json.dumps(completion(answer, choices, USAGE)))
    vllm_protocol().CompletionResponse.model_validate(whole)
    Completion.model_validate(whole)
    assert [choice["stop_reason"] for choice in whole["choices"]] == [2, None]
    assert whole["choices"][0]["prompt_logprobs"] == [
        None,
        {"5": {"logprob": -2.0, "rank": 3, "decoded_token": "Once"}},
    ]


@pytest.mark.parametrize(("asked", "stream"), [(1, True), (-2, False)])
def test_prompt_logprobs_are_refused_as_vllm_refuses_them(asked: int, stream: bool) -> None:
    body = _completion(prompt_logprobs=asked, stream=stream)
    assert _refusal(body).detail["param"] == "prompt_logprobs"
    assert _completion(prompt_logprobs=2).job_request(LIMIT).prompt_logprobs == 2
