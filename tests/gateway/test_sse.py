"""The relay's own SSE frames, byte for byte as sse-starlette (used by the compatible routes) writes them."""

from __future__ import annotations

import pytest
from sse_starlette.sse import ServerSentEvent

from gateway.relay.entries import Entry
from gateway.relay.sse import entry_frame, frame


@pytest.mark.parametrize(
    ("data", "event", "event_id"),
    [
        ('{"type":"delta","text":"hi"}', "delta", "1700000000000-0"),
        ("one\ntwo\r\nthree\rfour", "multi\nline", "12\r\n-3"),
        ("", None, None),
        ("no event name", None, "5-1"),
        ("trailing break\n", "message", None),
    ],
)
def test_frames_match_sse_starlettes_encoder(data: str, event: str | None, event_id: str | None) -> None:
    assert frame(data, event, event_id) == ServerSentEvent(data, event=event, id=event_id).encode()


@pytest.mark.parametrize(
    ("event", "data"), [("done", '{"type":"done"}'), ("delta", "two\nlines"), ("odd\rtype", "{}")]
)
def test_an_entry_is_framed_with_its_stream_id_as_the_event_id(event: str, data: str) -> None:
    entry = Entry("1700000000000-7", event, data)
    assert entry_frame(entry) == ServerSentEvent(data, event=event, id="1700000000000-7").encode()
