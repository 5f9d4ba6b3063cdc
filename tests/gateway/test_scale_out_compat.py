"""vLLM's scale-out shapes without Redis or a worker: a tokens-in/tokens-out request turned into a job,
its answers and chunks made from a job's events, and a render's sampling parameters, each parsed or
built by vLLM's own protocol models, as a client of vLLM's server would."""

from __future__ import annotations

from typing import Any

import pytest

from gateway.compat.generate_answers import GenerateAnswer, GenerateChunks
from gateway.compat.generate_bodies import GenerateBody
from gateway.compat.openai_bodies import CompletionBody
from gateway.compat.render import render_requests
from shared.errors import InvalidRequest
from shared.events import DeltaEvent, DoneEvent, Event, StatusEvent, TokenLogprob, TopLogprob, Usage
from tests.vllm_protocol import vllm_protocol

LIMIT = 2048
IDS = [504, 3575, 282]


def _body(**fields: Any) -> GenerateBody:
    return GenerateBody.model_validate({"token_ids": IDS, "sampling_params": {}, **fields})


def _answer(text: bool = False, logprobs: int | None = None, prompt_ids: bool = False) -> GenerateAnswer:
    return GenerateAnswer("generate-tokens-r1", "m", 1, text, logprobs, IDS if prompt_ids else None)


def _logprob(token_id: int) -> TokenLogprob:
    alternatives = [
        TopLogprob(token_id=token_id + k, token=f"t{token_id + k}", logprob=-1.0 - k) for k in (1, 0)
    ]
    return TokenLogprob(
        token_id=token_id, token=f"t{token_id}", logprob=-1.0, rank=2, top_logprobs=alternatives
    )


EVENTS: list[Event] = [
    StatusEvent(seq=0, state="queued"),
    StatusEvent(seq=1, state="running"),
    DeltaEvent(seq=2, text="a", token_ids=[7], logprobs=[_logprob(7)]),
    DeltaEvent(seq=3, index=1, text="x", token_ids=[8], logprobs=[_logprob(8)]),
    DeltaEvent(seq=4, text="bc", token_ids=[9, 10], logprobs=[_logprob(9), _logprob(10)]),
    DoneEvent(
        seq=5,
        finish_reason="length",
        finish_reasons=["length", "stop"],
        stop_reasons=[None, "\n"],
        usage=Usage(prompt_tokens=3, completion_tokens=4),
    ),
]


def test_every_sampling_option_reaches_the_job_under_its_job_name() -> None:
    options = {
        "n": 2,
        "temperature": 0.5,
        "top_p": 0.9,
        "top_k": 40,
        "min_p": 0.1,
        "seed": 3,
        "stop": ["\n"],
        "stop_token_ids": [2],
        "ignore_eos": True,
        "max_tokens": 9,
        "min_tokens": 1,
        "logprobs": 2,
        "presence_penalty": 0.5,
        "frequency_penalty": -0.5,
        "repetition_penalty": 1.2,
        "skip_special_tokens": False,
        "spaces_between_special_tokens": False,
        "include_stop_str_in_output": True,
        "logit_bias": {"42": 5},
        "stream_interval": 4,
    }
    body = _body(sampling_params=options, cache_salt="salt", priority=-2)
    job = body.job_request(LIMIT)
    assert job.prompt_token_ids == IDS and (job.cache_salt, job.priority) == ("salt", -2)
    assert (job.n, job.top_k, job.stop, job.logit_bias, job.stream_step) == (2, 40, ["\n"], {"42": 5.0}, 4)
    assert not body.fills_context
    # What vLLM's own parser makes of the same body gives the same options.
    params = (
        vllm_protocol().GenerateRequest.model_validate(body.model_dump(exclude_none=True)).sampling_params
    )
    for name in options.keys() - {"logit_bias", "stream_interval"}:
        assert getattr(params, name) == options[name], name


def test_without_max_tokens_the_job_fills_the_context_as_vllm() -> None:
    body = _body()
    assert body.fills_context and body.job_request(LIMIT).max_tokens == LIMIT
    assert _body(sampling_params={"max_tokens": None}).fills_context


def test_what_vllms_render_writes_is_taken() -> None:
    """A render's answer goes to /inference/v1/generate as it is: its neutral values and the server's
    own settings are taken."""
    rendered = {
        "request_id": "cmpl-1",
        "token_ids": IDS,
        "token_offsets": [[0, 4], [4, 9], [9, 12]],
        "features": None,
        "content_parts": None,
        "sampling_params": {"max_tokens": 5, "stop": [], "bad_words": [], "skip_reading_prefix_cache": False}
        | {"output_kind": 2, "skip_clone": True},
        "reasoning_ended": None,
        "kv_transfer_params": None,
    }
    assert GenerateBody.model_validate(rendered).job_request(LIMIT).max_tokens == 5


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"sampling_params": {"bad_words": ["x"]}}, "sampling_params.bad_words"),
        ({"sampling_params": {"allowed_token_ids": [1]}}, "sampling_params.allowed_token_ids"),
        ({"sampling_params": {"stop": "x", "detokenize": False}}, "sampling_params.stop"),
        ({"reasoning_parser_kwargs": {}}, "reasoning_parser_kwargs"),
        ({"reasoning_ended": False}, "reasoning_ended"),
        ({"sampling_params": {"logprobs": -1}}, "sampling_params.logprobs"),
        ({"sampling_params": {"stream_interval": 0}}, "sampling_params.stream_interval"),
        ({"cache_salt": "a/b"}, "cache_salt"),
    ],
)
def test_what_a_job_cannot_do_is_refused_naming_the_parameter(fields: dict[str, Any], param: str) -> None:
    with pytest.raises(InvalidRequest) as caught:
        _body(**fields).job_request(LIMIT)
    assert caught.value.detail["param"] == param


@pytest.mark.parametrize("text", [False, True])
def test_a_whole_answer_parses_as_vllms_response(text: bool) -> None:
    protocol = vllm_protocol()
    answer = _answer(text=text, logprobs=2, prompt_ids=True)
    first = _logprob(7)
    choices = [([7, 9], "ab", [first, _logprob(9)], "length", None), ([8], "x", [_logprob(8)], "stop", "\n")]
    whole = answer.whole(choices, Usage(prompt_tokens=3, completion_tokens=3))
    model = protocol.GenerateTextResponse if text else protocol.GenerateTokensResponse
    parsed = model.model_validate(whole)
    assert (parsed.request_id, parsed.prompt_token_ids, parsed.usage.total_tokens) == (
        "generate-tokens-r1",
        IDS,
        6,
    )
    assert [(c.index, c.token_ids, c.finish_reason, c.stop_reason) for c in parsed.choices] == [
        (0, [7, 9], "length", None),
        (1, [8], "stop", "\n"),
    ]
    position = parsed.choices[0].logprobs.content[0]
    if text:
        assert parsed.choices[1].text == "x"
        assert [top.token for top in position.top_logprobs] == ["t7", "t8"]  # the sampled one first
    else:
        assert (position.token_id, position.rank) == (7, 2)
        assert [(top.token_id, top.rank) for top in position.top_logprobs] == [(7, 2), (8, 1)]


@pytest.mark.parametrize("text", [False, True])
def test_streamed_chunks_parse_as_vllms_and_add_up_to_each_choice(text: bool) -> None:
    protocol = vllm_protocol()
    chunks = GenerateChunks(_answer(text=text, prompt_ids=True), True, True, prompt_tokens=3)
    made = [chunk for event in EVENTS for chunk in chunks.feed(event)]
    model = protocol.GenerateTextStreamResponse if text else protocol.GenerateTokensStreamResponse
    parsed = [model.model_validate(chunk) for chunk in made]
    assert parsed[0].prompt_token_ids == IDS and all(chunk.prompt_token_ids is None for chunk in parsed[1:])
    *with_choices, last = parsed
    assert last.choices == [] and last.usage is not None and last.usage.completion_tokens == 4
    ids: dict[int, list[int]] = {0: [], 1: []}
    for chunk in with_choices:
        (choice,) = chunk.choices
        ids[choice.index] += choice.token_ids
        assert chunk.usage is not None and chunk.usage.prompt_tokens == 3  # continuous_usage_stats
    assert ids == {0: [7, 9, 10], 1: [8]}
    ends = [
        (c.choices[0].index, c.choices[0].finish_reason, c.choices[0].stop_reason) for c in with_choices[-2:]
    ]
    assert ends == [(0, "length", None), (1, "stop", "\n")]
    assert with_choices[-2].usage.completion_tokens == 3  # the choice's own tokens, as vLLM counts
    if text:
        assert "".join(c.choices[0].text for c in with_choices if c.choices[0].index == 0) == "abc"


def test_without_usage_asked_for_chunks_have_none_and_no_usage_chunk_ends_them() -> None:
    chunks = GenerateChunks(_answer(), False, False, prompt_tokens=3)
    made = [chunk for event in EVENTS for chunk in chunks.feed(event)]
    assert all(chunk["usage"] is None and chunk["choices"] for chunk in made)
    assert all("prompt_token_ids" not in chunk for chunk in made)


def test_a_render_samples_as_vllms_own_completion_request_would() -> None:
    """The sampling parameters a render writes are those vLLM's `CompletionRequest` makes of the body."""
    protocol = vllm_protocol()
    body_fields = {
        "model": "m",
        "prompt": "Once",
        "max_tokens": 9,
        "temperature": 0.3,
        "top_p": 0.8,
        "top_k": 20,
        "seed": 4,
        "stop": ["."],
        "presence_penalty": 0.1,
        "frequency_penalty": 0.2,
        "repetition_penalty": 1.1,
        "min_p": 0.05,
        "min_tokens": 2,
        "stop_token_ids": [3],
        "ignore_eos": True,
        "logprobs": 1,
        "logit_bias": {"5": 1.5},
        "skip_special_tokens": False,
    }
    body = CompletionBody.model_validate(body_fields)
    (rendered,) = render_requests(body.job_request(LIMIT), body, [[1, 2]], "x", 64)
    ours = protocol.GenerateRequest.model_validate(rendered).sampling_params
    vllms = protocol.CompletionRequest.model_validate(body_fields).to_sampling_params(9, {})
    for name in [*body_fields.keys() - {"model", "prompt"}, "n", "spaces_between_special_tokens"]:
        assert getattr(ours, name) == getattr(vllms, name), name
