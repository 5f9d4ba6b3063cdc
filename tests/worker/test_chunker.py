"""The chunker: engine deltas to job events, coalesced by `stream_step`, with exact usage."""

from __future__ import annotations

import pytest

from shared.events import (
    TERMINAL_EVENT_TYPES,
    CancelledEvent,
    DeltaEvent,
    DoneEvent,
    ErrorEvent,
    Event,
    TokenLogprob,
)
from worker.chunker import Chunker
from worker.engine import EngineDelta

PROMPT_TOKENS = 11
FIRST_SEQ = 2


def one_token_steps(count: int, logprobs: bool = False, finish_last: bool = False) -> list[EngineDelta]:
    """`count` engine steps of one token each: token id 100+i, text 't{i} '."""
    steps = []
    for i in range(count):
        token_id = 100 + i
        lp = [TokenLogprob(token_id=token_id, token=f"t{i} ", logprob=-0.1 * i)] if logprobs else None
        last = finish_last and i == count - 1
        reason = "length" if last else None
        steps.append(EngineDelta(f"t{i} ", [token_id], logprobs=lp, finished=last, finish_reason=reason))
    return steps


def feed_all(chunker: Chunker, steps: list[EngineDelta]) -> list[Event]:
    return [event for step in steps for event in chunker.feed(step)]


def end(chunker: Chunker, ending: str) -> list[Event]:
    if ending == "done":
        return chunker.done()
    if ending == "cancelled":
        return chunker.cancelled()
    return chunker.error("boom", "internal")


def delta_events(events: list[Event]) -> list[DeltaEvent]:
    return [event for event in events if isinstance(event, DeltaEvent)]


@pytest.mark.parametrize("stream_step", [1, 2, 3, 5, 7, 8])
def test_each_delta_holds_stream_step_tokens_except_possibly_the_last(stream_step: int) -> None:
    chunker = Chunker(stream_step, PROMPT_TOKENS, FIRST_SEQ)
    events = feed_all(chunker, one_token_steps(7)) + chunker.done()
    sizes = [len(event.token_ids) for event in delta_events(events)]
    assert sizes[:-1] == [stream_step] * (len(sizes) - 1)
    assert 1 <= sizes[-1] <= stream_step
    assert sum(sizes) == 7


def test_tokens_are_held_back_until_stream_step_of_them_gathered() -> None:
    chunker = Chunker(3, PROMPT_TOKENS, FIRST_SEQ)
    steps = one_token_steps(3)
    assert chunker.feed(steps[0]) == []
    assert chunker.feed(steps[1]) == []
    [event] = chunker.feed(steps[2])
    assert isinstance(event, DeltaEvent)
    assert event.token_ids == [100, 101, 102]
    assert event.text == "t0 t1 t2 "


def test_finished_engine_step_flushes_what_is_held_back() -> None:
    chunker = Chunker(4, PROMPT_TOKENS, FIRST_SEQ)
    events = feed_all(chunker, one_token_steps(2, finish_last=True))
    assert [event.token_ids for event in delta_events(events)] == [[100, 101]]
    assert [event.type for event in chunker.done()] == ["done"]


def test_final_engine_step_without_tokens_adds_no_empty_delta() -> None:
    chunker = Chunker(1, PROMPT_TOKENS, FIRST_SEQ)
    events = feed_all(chunker, one_token_steps(2))
    events += chunker.feed(EngineDelta(text="", token_ids=[], finished=True, finish_reason="stop"))
    events += chunker.done()
    assert [event.type for event in events] == ["delta", "delta", "done"]


@pytest.mark.parametrize("next_seq", [0, 2, 40])
@pytest.mark.parametrize("stream_step", [1, 3])
def test_seq_numbers_are_consecutive_from_next_seq(next_seq: int, stream_step: int) -> None:
    chunker = Chunker(stream_step, PROMPT_TOKENS, next_seq)
    events = feed_all(chunker, one_token_steps(7)) + chunker.done()
    assert [event.seq for event in events] == list(range(next_seq, next_seq + len(events)))
    assert chunker.next_seq == next_seq + len(events)


@pytest.mark.parametrize("ending", ["done", "cancelled", "error"])
@pytest.mark.parametrize("stream_step", [1, 2, 4])
def test_every_token_is_in_exactly_one_delta_before_the_one_terminal_event(
    ending: str, stream_step: int
) -> None:
    chunker = Chunker(stream_step, PROMPT_TOKENS, FIRST_SEQ)
    steps = one_token_steps(6)
    events = feed_all(chunker, steps)
    events += end(chunker, ending)
    assert events[-1].type == ending
    assert [event.type in TERMINAL_EVENT_TYPES for event in events] == [False] * (len(events) - 1) + [True]
    streamed = [token for event in delta_events(events) for token in event.token_ids]
    assert streamed == [token for step in steps for token in step.token_ids]


def test_done_carries_finish_reason_and_exact_usage() -> None:
    chunker = Chunker(2, PROMPT_TOKENS, FIRST_SEQ)
    feed_all(chunker, one_token_steps(5, finish_last=True))
    done = chunker.done()[-1]
    assert isinstance(done, DoneEvent)
    assert done.finish_reason == "length"
    assert (done.usage.prompt_tokens, done.usage.completion_tokens) == (PROMPT_TOKENS, 5)


def test_cancelled_carries_the_usage_so_far_after_the_held_back_tokens() -> None:
    chunker = Chunker(4, PROMPT_TOKENS, FIRST_SEQ)
    feed_all(chunker, one_token_steps(6))
    tail = chunker.cancelled()
    assert [event.type for event in tail] == ["delta", "cancelled"]
    assert isinstance(tail[0], DeltaEvent) and tail[0].token_ids == [104, 105]
    assert isinstance(tail[1], CancelledEvent)
    assert (tail[1].usage.prompt_tokens, tail[1].usage.completion_tokens) == (PROMPT_TOKENS, 6)


def test_error_carries_message_code_and_usage_counts_fed_tokens() -> None:
    chunker = Chunker(1, PROMPT_TOKENS, FIRST_SEQ)
    feed_all(chunker, one_token_steps(3))
    [error] = chunker.error("engine died", "engine_error")
    assert isinstance(error, ErrorEvent)
    assert (error.message, error.code) == ("engine died", "engine_error")
    assert chunker.usage.completion_tokens == 3


def test_cancel_before_any_token_has_zero_completion_tokens_and_no_delta() -> None:
    chunker = Chunker(1, PROMPT_TOKENS, FIRST_SEQ)
    [event] = chunker.cancelled()
    assert isinstance(event, CancelledEvent)
    assert event.seq == FIRST_SEQ
    assert (event.usage.prompt_tokens, event.usage.completion_tokens) == (PROMPT_TOKENS, 0)


@pytest.mark.parametrize("stream_step", [1, 3])
def test_logprobs_travel_with_their_tokens(stream_step: int) -> None:
    chunker = Chunker(stream_step, PROMPT_TOKENS, FIRST_SEQ)
    events = feed_all(chunker, one_token_steps(7, logprobs=True)) + chunker.done()
    for event in delta_events(events):
        assert event.logprobs is not None
        assert [lp.token_id for lp in event.logprobs] == event.token_ids
        assert "".join(lp.token for lp in event.logprobs) == event.text


def test_deltas_without_logprobs_carry_none() -> None:
    chunker = Chunker(2, PROMPT_TOKENS, FIRST_SEQ)
    events = feed_all(chunker, one_token_steps(4)) + chunker.done()
    assert [event.logprobs for event in delta_events(events)] == [None, None]


@pytest.mark.parametrize("stream_step", [1, 2, 5])
def test_streamed_text_adds_up_to_the_chunker_text(stream_step: int) -> None:
    chunker = Chunker(stream_step, PROMPT_TOKENS, FIRST_SEQ)
    events = feed_all(chunker, one_token_steps(9)) + chunker.done()
    assert "".join(event.text for event in delta_events(events)) == chunker.text
    assert chunker.text == "".join(f"t{i} " for i in range(9))


def test_multi_token_engine_steps_stay_together_in_one_delta() -> None:
    """An engine output of several tokens has one text for all of them: it is never split."""
    chunker = Chunker(2, PROMPT_TOKENS, FIRST_SEQ)
    steps = [EngineDelta(text="abc", token_ids=[1, 2, 3]), EngineDelta(text="de", token_ids=[4, 5])]
    events = feed_all(chunker, steps) + chunker.done()
    assert [(event.text, event.token_ids) for event in delta_events(events)] == [
        ("abc", [1, 2, 3]),
        ("de", [4, 5]),
    ]


def test_choices_keep_apart_in_one_sequence_and_add_up_in_usage() -> None:
    """n=2 with interleaved steps: each choice coalesces its own tokens, `seq` runs over the job."""
    chunker = Chunker(2, PROMPT_TOKENS, FIRST_SEQ, n=2)
    steps = [
        EngineDelta("a0", [1], index=0),
        EngineDelta("b0", [11], index=1),
        EngineDelta("a1", [2], index=0),
        EngineDelta("b1", [12], index=1, finished=True, finish_reason="stop", stop_reason=12),
        EngineDelta("a2", [3], index=0),
    ]
    events = feed_all(chunker, steps)
    assert not chunker.finished
    events += chunker.feed(EngineDelta("", [], index=0, finished=True, finish_reason="length"))
    assert chunker.finished
    events += chunker.done()
    assert [event.seq for event in events] == list(range(FIRST_SEQ, FIRST_SEQ + len(events)))
    deltas = delta_events(events)
    assert [(event.index, event.token_ids) for event in deltas] == [(0, [1, 2]), (1, [11, 12]), (0, [3])]
    assert chunker.text == "a0a1a2" and chunker.output.token_count == 3
    done = events[-1]
    assert isinstance(done, DoneEvent)
    assert (done.finish_reason, done.finish_reasons) == ("length", ["length", "stop"])
    assert done.stop_reasons == [None, 12]  # the stop token that ended choice 1
    assert (done.usage.prompt_tokens, done.usage.completion_tokens) == (PROMPT_TOKENS, 5)


def test_one_choice_streams_without_index_or_finish_reasons() -> None:
    """A job of one choice writes the events it always has: no `index`, no `finish_reasons`."""
    chunker = Chunker(1, PROMPT_TOKENS, FIRST_SEQ)
    events = feed_all(chunker, one_token_steps(1, finish_last=True)) + chunker.done()
    dumped = [event.model_dump(mode="json") for event in events]
    assert "index" not in dumped[0] and "finish_reasons" not in dumped[-1]
    assert "stop_reasons" not in dumped[-1]  # no stop string or stop token ended it
    assert "index" in DeltaEvent(seq=0, index=1, text="", token_ids=[]).model_dump()


def test_held_back_tokens_of_every_choice_flush_before_the_end() -> None:
    chunker = Chunker(4, PROMPT_TOKENS, FIRST_SEQ, n=3)
    for index in (2, 0):
        chunker.feed(EngineDelta(f"c{index}", [index], index=index))
    events = chunker.cancelled()
    assert [(event.type, getattr(event, "index", None)) for event in events] == [
        ("delta", 0),
        ("delta", 2),
        ("cancelled", None),
    ]
