"""TGI conversions without Redis: request mapping and refusals, token texts, finish reasons, stream events."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest
from pydantic import ValidationError

from gateway.compat.tgi import (
    DetailedResponse,
    ErrorResponse,
    GenerateRequest,
    StreamResponse,
    TokenStream,
    error,
    finish_reason,
    generated,
    token_texts,
    with_lookahead,
)
from shared.errors import InvalidRequest
from shared.events import (
    CancelledEvent,
    DeltaEvent,
    DoneEvent,
    ErrorEvent,
    JobState,
    StatusEvent,
    TokenLogprob,
    Usage,
)

LIMIT = 2048
EOS = TokenLogprob(token_id=2, token="<|im_end|>", logprob=-0.5)


def body(**parameters: Any) -> GenerateRequest:
    return GenerateRequest.model_validate({"inputs": "Hello", "parameters": parameters})


def lps(*pieces: str) -> list[TokenLogprob]:
    return [TokenLogprob(token_id=100 + i, token=piece, logprob=-0.25 * i) for i, piece in enumerate(pieces)]


def delta(seq: int, text: str, logprobs: list[TokenLogprob]) -> DeltaEvent:
    return DeltaEvent(seq=seq, text=text, token_ids=[lp.token_id for lp in logprobs], logprobs=logprobs)


def done(reason: str, completion_tokens: int) -> DoneEvent:
    return DoneEvent(
        seq=99, finish_reason=reason, usage=Usage(prompt_tokens=7, completion_tokens=completion_tokens)
    )


def tokens_of(messages: list[StreamResponse | ErrorResponse]) -> list[StreamResponse]:
    return [message for message in messages if isinstance(message, StreamResponse)]


# Requests


def test_defaults_are_tgi_greedy_decoding_of_100_tokens_without_logprobs() -> None:
    job = body().job_request(LIMIT, stream=False)
    assert (job.prompt, job.max_tokens, job.temperature, job.seed, job.logprobs) == (
        "Hello",
        100,
        0.0,
        None,
        None,
    )


def test_default_max_new_tokens_stays_within_the_gateway_limit() -> None:
    assert body().job_request(64, stream=False).max_tokens == 64


def test_streams_and_details_ask_for_token_logprobs() -> None:
    assert body().job_request(LIMIT, stream=True).logprobs == 0
    assert body(details=True).job_request(LIMIT, stream=False).logprobs == 0


@pytest.mark.parametrize(
    ("parameters", "temperature"),
    [
        ({"do_sample": True}, 1.0),
        ({"temperature": 0.7}, 0.7),
        ({"do_sample": True, "temperature": 0.3}, 0.3),
        ({"top_k": 5}, 1.0),
        ({"top_p": 0.9}, 1.0),
        ({"temperature": 1.0}, 0.0),  # TGI: temperature 1 alone changes nothing, so decoding stays greedy
        ({"do_sample": False, "top_p": 1.0}, 0.0),
    ],
)
def test_sampling_follows_tgi_do_sample_or_a_sampling_parameter(
    parameters: dict[str, Any], temperature: float
) -> None:
    assert body(**parameters).job_request(LIMIT, stream=False).temperature == temperature


def test_parameters_reach_the_job() -> None:
    job = body(max_new_tokens=7, top_k=3, top_p=0.5, seed=42, stop=["\n", "."]).job_request(
        LIMIT, stream=False
    )
    assert (job.max_tokens, job.top_k, job.top_p, job.seed, job.stop) == (7, 3, 0.5, 42, ["\n", "."])


def test_seed_is_reported_only_when_sampling() -> None:
    assert body(seed=5, do_sample=True).parameters.reported_seed == 5
    assert body(seed=5).parameters.reported_seed is None


@pytest.mark.parametrize(
    ("parameters", "name"),
    [
        ({"decoder_input_details": True}, "decoder_input_details"),
        ({"truncate": 100}, "truncate"),
        ({"repetition_penalty": 1.2}, "repetition_penalty"),
        ({"frequency_penalty": 0.5}, "frequency_penalty"),
        ({"typical_p": 0.5}, "typical_p"),
        ({"watermark": True}, "watermark"),
        ({"grammar": {"type": "regex", "value": "[0-9]+"}}, "grammar"),
        ({"best_of": 2}, "best_of"),
        ({"top_n_tokens": 3}, "top_n_tokens"),
        ({"adapter_id": "my-lora"}, "adapter_id"),
    ],
)
def test_unsupported_parameters_are_refused_by_name(parameters: dict[str, Any], name: str) -> None:
    with pytest.raises(InvalidRequest, match=f"parameters.{name}:") as refused:
        body(**parameters).job_request(LIMIT, stream=False)
    assert refused.value.detail["param"] == name


@pytest.mark.parametrize(
    "parameters",
    [
        {"repetition_penalty": 1.0},
        {"frequency_penalty": 0.0},
        {"typical_p": 1.0},
        {"best_of": 1},
        {"top_n_tokens": 0},
        {"watermark": False, "decoder_input_details": False},
    ],
)
def test_default_values_of_unsupported_parameters_are_accepted(parameters: dict[str, Any]) -> None:
    assert body(**parameters).job_request(LIMIT, stream=False).prompt == "Hello"


def test_a_job_field_admission_refuses_is_named_as_tgi_names_it() -> None:
    error = GenerateRequest.in_own_terms(InvalidRequest.of_field("max_tokens", f"must be at most {LIMIT}"))
    assert error.message == f"parameters.max_new_tokens: must be at most {LIMIT}"
    assert error.detail == {"param": "max_new_tokens"}


@pytest.mark.parametrize(
    ("parameters", "message"),
    [
        ({"temperature": 3.0}, "parameters.temperature: "),
        ({"stop": [""]}, "parameters.stop: "),
        ({"seed": 2**64 - 1}, "parameters.seed: "),
    ],
)
def test_values_a_job_refuses_are_reported_under_tgi_names(parameters: dict[str, Any], message: str) -> None:
    with pytest.raises(InvalidRequest, match=message):
        body(**parameters).job_request(LIMIT, stream=False)


def test_unknown_parameters_and_empty_inputs_fail_validation() -> None:
    with pytest.raises(ValidationError, match="presence_penalty"):
        body(presence_penalty=1.0)
    with pytest.raises(ValidationError, match="at most 16 items"):
        body(stop=["x"] * 17)
    with pytest.raises(ValidationError, match="inputs"):
        GenerateRequest.model_validate({"inputs": ""})


# Token texts and finish reasons


def test_token_texts_keep_pieces_that_spell_the_text() -> None:
    assert token_texts(" a b", [" a", " b"]) == [" a", " b"]


def test_token_texts_put_what_differs_in_the_last_token() -> None:
    assert token_texts(" grape", [" grape", ","]) == [" grape", ""]  # stop string cut off
    assert token_texts(" Hi", [" Hi", "<|im_end|>"]) == [" Hi", ""]  # special token
    assert token_texts(" é!", ["\ufffd", "\ufffd", "!"]) == ["", "", " é!"]  # a character split in bytes
    assert token_texts(" date", [" date,"]) == [" date"]
    assert token_texts("", []) == []


def test_finish_reasons_tell_stop_strings_from_end_of_sequence() -> None:
    assert finish_reason("length", "a", "a", []) == "length"
    assert finish_reason("stop", " grape", " grape,", [","]) == "stop_sequence"
    assert finish_reason("stop", " grape", " grape<|im_end|>", [","]) == "eos_token"
    assert finish_reason("stop", " Hi", " Hi<|im_end|>", []) == "eos_token"


def test_errors_get_tgi_types_and_statuses() -> None:
    assert error("too long", "prompt_too_long") == (
        ErrorResponse(error="too long", error_type="validation"),
        422,
    )
    assert error("boom", "engine_error")[1] == 424
    assert error("boom", "engine_error")[0].error_type == "generation"
    assert error("busy", "overloaded")[1] == 429
    assert error("gone", "cancelled")[0].error_type == "incomplete_generation"


# Whole answers


def test_generated_text_without_details_is_only_the_text() -> None:
    answer = generated(body(), " world", [], "length", 1)
    assert answer.model_dump() == {"generated_text": " world"}


def test_return_full_text_prepends_the_inputs() -> None:
    assert generated(body(return_full_text=True), " world", [], "length", 1).generated_text == "Hello world"


def test_details_list_every_token_and_mark_the_end_of_sequence_special() -> None:
    answer = generated(
        body(details=True, do_sample=True, seed=9), " Hi there", [*lps(" Hi", " there"), EOS], "stop", 3
    )
    assert isinstance(answer, DetailedResponse)
    details = answer.details
    assert (details.finish_reason, details.generated_tokens, details.seed, details.prefill) == (
        "eos_token",
        3,
        9,
        [],
    )
    assert [token.id for token in details.tokens] == [100, 101, 2]
    assert "".join(token.text for token in details.tokens) == answer.generated_text == " Hi there"
    assert [token.special for token in details.tokens] == [False, False, True]
    assert details.tokens[0].logprob == 0.0 and details.tokens[1].logprob == -0.25


def test_details_of_a_stop_string_finish() -> None:
    answer = generated(body(details=True, stop=[","]), " grape", lps(" grape", ","), "stop", 2)
    assert isinstance(answer, DetailedResponse)
    assert answer.details.finish_reason == "stop_sequence"
    assert [(token.text, token.special) for token in answer.details.tokens] == [
        (" grape", False),
        ("", False),
    ]


# Streams


def test_stream_sends_one_event_per_token_and_the_last_one_at_the_end() -> None:
    stream = TokenStream(body(details=True))
    assert stream.feed(StatusEvent(seq=0, state=JobState.running)) == []
    first = tokens_of(stream.feed(delta(2, " a b", lps(" a", " b"))))
    assert [(m.index, m.token.text, m.generated_text) for m in first] == [(1, " a", None)]
    second = tokens_of(stream.feed(delta(3, " c", [TokenLogprob(token_id=7, token=" c", logprob=-1.0)])))
    assert [(m.index, m.token.text) for m in second] == [(2, " b")]
    [last] = tokens_of(stream.feed(done("length", 3)))
    assert (last.index, last.token.id, last.token.text, last.generated_text) == (3, 7, " c", " a b c")
    assert last.details is not None
    assert (last.details.finish_reason, last.details.generated_tokens, last.details.input_length) == (
        "length",
        3,
        7,
    )


def test_flush_sends_the_held_token_on_as_not_the_last() -> None:
    stream = TokenStream(body())
    assert stream.feed(delta(2, " a", lps(" a"))) == []
    [flushed] = tokens_of(stream.flush())
    assert (flushed.index, flushed.token.text, flushed.generated_text) == (1, " a", None)
    assert stream.flush() == []


def test_stream_token_texts_join_to_the_job_text_with_a_special_end_of_sequence_token() -> None:
    stream = TokenStream(body())
    messages = [
        *stream.feed(delta(2, "", lps("\ufffd"))),
        *stream.feed(delta(3, " é", lps(" é"))),
        *stream.feed(delta(4, "", [EOS])),
        *stream.feed(done("stop", 3)),
    ]
    tokens = tokens_of(messages)
    assert "".join(m.token.text for m in tokens) == tokens[-1].generated_text == " é"
    assert [m.token.special for m in tokens] == [False, False, True]
    assert tokens[-1].details is None  # details were not asked for


def test_stream_with_return_full_text_ends_with_the_inputs_and_the_text() -> None:
    stream = TokenStream(body(return_full_text=True))
    stream.feed(delta(2, " world", lps(" world")))
    [last] = tokens_of(stream.feed(done("length", 1)))
    assert (last.token.text, last.generated_text) == (" world", "Hello world")


def test_text_without_tokens_goes_with_the_next_token() -> None:
    stream = TokenStream(body())
    assert stream.feed(DeltaEvent(seq=2, text=" a", token_ids=[])) == []
    messages = [*stream.feed(delta(3, " b", lps(" b"))), *stream.feed(done("length", 1))]
    assert [m.token.text for m in tokens_of(messages)] == [" a b"]


def test_done_without_a_held_token_ends_with_an_empty_special_token() -> None:
    stream = TokenStream(body())
    messages = [*stream.feed(delta(2, " a", lps(" a"))), *stream.flush(), *stream.feed(done("length", 1))]
    assert [(m.token.text, m.token.special, m.generated_text) for m in tokens_of(messages)] == [
        (" a", False, None),
        ("", True, " a"),
    ]


@pytest.mark.parametrize(
    ("terminal", "expected"),
    [
        (ErrorEvent(seq=4, message="too long", code="prompt_too_long"), ("too long", "validation")),
        (ErrorEvent(seq=4, message="engine died", code="engine_error"), ("engine died", "generation")),
        (CancelledEvent(seq=4, usage=Usage(prompt_tokens=7, completion_tokens=1)), None),
    ],
)
def test_a_failed_job_sends_its_tokens_then_a_tgi_error_event(
    terminal: ErrorEvent | CancelledEvent, expected: tuple[str, str] | None
) -> None:
    stream = TokenStream(body())
    messages = [*stream.feed(delta(2, " a", lps(" a"))), *stream.feed(terminal)]
    assert [m.token.text for m in tokens_of(messages)] == [" a"]
    last = messages[-1]
    assert isinstance(last, ErrorResponse)
    assert (last.error, last.error_type) == (expected or ("the job was cancelled", "incomplete_generation"))


# Lookahead


async def reader(
    batches: list[list[int]], reads: asyncio.Queue[None], closed: asyncio.Event
) -> AsyncIterator[int]:
    """Items in batches; each batch waits for one `reads` item, as a Redis read waits for entries."""
    try:
        for batch in batches:
            await reads.get()
            for item in batch:
                yield item
    finally:
        closed.set()


async def test_lookahead_says_whether_the_next_item_was_read_with_this_one() -> None:
    reads: asyncio.Queue[None] = asyncio.Queue()
    reads.put_nowait(None)
    items = with_lookahead(reader([[1, 2], [3]], reads, asyncio.Event()))
    assert await anext(items) == (1, True)
    assert await anext(items) == (2, False)
    reads.put_nowait(None)
    assert await anext(items) == (3, True)  # the end is at hand too
    with pytest.raises(StopAsyncIteration):
        await anext(items)


async def test_closing_the_lookahead_early_ends_the_pending_read() -> None:
    reads: asyncio.Queue[None] = asyncio.Queue()
    reads.put_nowait(None)
    closed = asyncio.Event()
    items = with_lookahead(reader([[1], [2]], reads, closed))
    assert await anext(items) == (1, False)
    await items.aclose()
    await asyncio.wait_for(closed.wait(), 10)  # the reader's pending read was cancelled: its cleanup ran
