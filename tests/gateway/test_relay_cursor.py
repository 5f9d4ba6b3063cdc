"""Client cursors are checked before they reach Redis; stream entries know the state they move a job into."""

from __future__ import annotations

import json

import pytest

from gateway.relay.cursors import START, parse_cursor
from gateway.relay.entries import Entry
from gateway.relay.polls import page_json
from shared.errors import InvalidRequest
from shared.events import JobState
from shared.requests import EventsPage

MAX_ID = "18446744073709551615"  # Redis stream ids are two unsigned 64-bit integers


@pytest.mark.parametrize("cursor", ["0", "0-0", "1700000000000-0", "1700000000000-15", f"{MAX_ID}-{MAX_ID}"])
def test_a_stream_id_is_a_valid_cursor(cursor: str) -> None:
    assert parse_cursor(cursor) == cursor


@pytest.mark.parametrize("cursor", [None, ""])
def test_no_cursor_means_from_the_start(cursor: str | None) -> None:
    assert parse_cursor(cursor) == START == "0-0"


@pytest.mark.parametrize(
    "cursor", ["abc", "$", ">", "+", "-", "-1", "1-", "-1-0", "1-2-3", "1.5", " 1-0", "1-0 ", "1_0", "0x10"]
)
def test_garbage_cursor_is_an_invalid_request(cursor: str) -> None:
    with pytest.raises(InvalidRequest):
        parse_cursor(cursor)


@pytest.mark.parametrize("cursor", ["1-0\n", "\u0661\u0662-0", "99999999999999999999-0"])
def test_cursor_redis_would_reject_is_an_invalid_request(cursor: str) -> None:
    with pytest.raises(InvalidRequest):
        parse_cursor(cursor)


def entry(event_type: str, **data: object) -> Entry:
    return Entry("1-0", event_type, json.dumps({"type": event_type, "seq": 0, **data}))


@pytest.mark.parametrize(
    ("event", "state", "terminal"),
    [
        (entry("status", state="queued"), JobState.queued, False),
        (entry("status", state="running"), JobState.running, False),
        (entry("delta", text="a", token_ids=[1]), None, False),
        (entry("done", finish_reason="stop"), JobState.completed, True),
        (entry("cancelled"), JobState.cancelled, True),
        (entry("error", message="m", code="c"), JobState.failed, True),
    ],
)
def test_entry_knows_the_state_it_moves_the_job_into(
    event: Entry, state: JobState | None, terminal: bool
) -> None:
    assert event.state is state
    assert event.terminal is terminal


@pytest.mark.parametrize(
    ("data", "event"),
    [
        ('{"type": "delta", "seq": 3}', {"type": "delta", "seq": 3}),
        ('{"type":"done","seq":4,"text":"\u00e9}"}', {"type": "done", "seq": 4, "text": "\u00e9}"}),
        ("{}", {}),
        (" { } ", {}),
    ],
)
def test_entry_as_json_puts_the_stream_id_first_in_the_event(data: str, event: dict[str, object]) -> None:
    as_json = Entry("5-1", "delta", data).as_json()
    assert json.loads(as_json) == {"id": "5-1", **event}
    assert as_json.startswith('{"id":"5-1"')


@pytest.mark.parametrize("done", [False, True])
def test_a_page_is_written_as_the_events_page_model_writes_it(done: bool) -> None:
    entries = [
        Entry("1-1", "status", json.dumps({"type": "status", "seq": 1, "state": "running"})),
        Entry("2-1", "delta", json.dumps({"type": "delta", "seq": 2, "text": 'é\n"', "logprobs": [-0.1]})),
    ]
    for listed in (entries, []):
        page = EventsPage(
            events=[{"id": entry.id, **json.loads(entry.data)} for entry in listed],
            cursor="2-1",
            status=JobState.running,
            done=done,
        )
        written = page_json(listed, "2-1", JobState.running, done)
        assert json.loads(written) == page.model_dump(mode="json")
