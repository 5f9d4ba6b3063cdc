"""The client library without a gateway: SSE parsing, error mapping, and resuming a dropped stream."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator

import httpx
import pytest

from client.api import Client, GatewayError, ServerSentEvent, gateway_error, parse_sse

Handler = Callable[[httpx.Request], httpx.Response]


def sse_body(*events: tuple[str | None, dict[str, object]]) -> bytes:
    """Events as the gateway frames them (sse-starlette, CRLF line ends); an id of None sends none."""
    frames = [
        ("" if id_ is None else f"id: {id_}\r\n")
        + f"event: {event['type']}\r\ndata: {json.dumps(event)}\r\n\r\n"
        for id_, event in events
    ]
    return "".join(frames).encode()


def delta(seq: int, text: str) -> dict[str, object]:
    return {"type": "delta", "seq": seq, "text": text, "token_ids": [seq]}


DONE = {
    "type": "done",
    "seq": 9,
    "finish_reason": "length",
    "usage": {"prompt_tokens": 1, "completion_tokens": 2},
}


class DroppingStream(httpx.SyncByteStream):
    """A response body that breaks off after its bytes, as a connection that drops."""

    def __init__(self, body: bytes) -> None:
        self.body = body

    def __iter__(self) -> Iterator[bytes]:
        yield self.body
        raise httpx.ReadError("connection reset by peer")


def client_with(*answers: Handler) -> tuple[Client, list[httpx.Request]]:
    """A client whose n-th request gets the n-th answer; the requests it made are recorded."""
    requests: list[httpx.Request] = []

    def handle(request: httpx.Request) -> httpx.Response:
        requests.append(request)
        return answers[len(requests) - 1](request)

    return Client("http://gateway", reconnect_delay=0, transport=httpx.MockTransport(handle)), requests


def test_sse_parser_reads_fields_and_skips_comments() -> None:
    lines = [": ping - 2026-01-01", "", "id: 1-0", "event: delta", "data: {}", "", "data:x", "retry: 10", ""]
    assert list(parse_sse(lines)) == [
        ServerSentEvent(event="delta", data="{}", id="1-0"),
        ServerSentEvent(event="message", data="x", id=None),
    ]


def test_sse_parser_joins_data_lines_and_strips_one_space_only() -> None:
    lines = ["data:  two spaces", "data", "data: end", ""]
    assert list(parse_sse(lines)) == [ServerSentEvent(event="message", data=" two spaces\n\nend", id=None)]


def test_sse_parser_gives_each_event_only_its_own_id() -> None:
    events = list(parse_sse(["id: 5-0", "data: a", "", "event: error", "data: b", ""]))
    assert [(event.id, event.event) for event in events] == [("5-0", "message"), (None, "error")]


def test_sse_parser_dispatches_nothing_without_data_and_drops_an_unfinished_event() -> None:
    assert list(parse_sse(["id: 1-0", "event: delta", "", "data: cut off"])) == []


def test_sse_parser_keeps_colons_inside_the_value() -> None:
    assert [event.data for event in parse_sse(["data: a: b:c", ""])] == ["a: b:c"]


def test_gateway_error_carries_the_gateway_type_message_and_extra_fields() -> None:
    answer = httpx.Response(410, json={"error": "too old", "error_type": "cursor_expired", "oldest": "9-0"})
    error = gateway_error(answer)
    assert (error.error_type, error.message, error.status_code) == ("cursor_expired", "too old", 410)
    assert error.detail == {"oldest": "9-0"}
    assert not error.transient


def test_gateway_error_of_a_foreign_body_keeps_the_status() -> None:
    error = gateway_error(httpx.Response(502, text="<html>bad gateway</html>"))
    assert (error.error_type, error.message, error.status_code) == ("http_error", "HTTP 502 Bad Gateway", 502)


def test_non_2xx_answer_raises_the_gateway_error() -> None:
    client, _ = client_with(
        lambda request: httpx.Response(404, json={"error": "no job x", "error_type": "not_found"})
    )
    with pytest.raises(GatewayError, match="no job x") as raised:
        client.record("x")
    assert raised.value.error_type == "not_found" and raised.value.status_code == 404


def test_no_answer_is_an_unreachable_error() -> None:
    def refuse(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("connection refused")

    client, _ = client_with(refuse)
    with pytest.raises(GatewayError, match="connection refused") as raised:
        client.cancel("x")
    assert raised.value.error_type == "unreachable" and raised.value.transient


def test_follow_resumes_a_dropped_stream_with_last_event_id() -> None:
    first = sse_body(("1-0", delta(2, "a")), ("2-0", delta(3, "b")))
    client, requests = client_with(
        lambda request: httpx.Response(200, stream=DroppingStream(first)),
        lambda request: httpx.Response(200, content=sse_body(("3-0", delta(4, "c")), ("4-0", DONE))),
    )
    events = list(client.follow("job", after="0-1"))
    assert [event.id for event in events] == ["1-0", "2-0", "3-0", "4-0"]
    assert [request.headers.get("Last-Event-ID") for request in requests] == ["0-1", "2-0"]
    assert all(request.headers["Accept"] == "text/event-stream" for request in requests)


def test_follow_reconnects_when_the_gateway_reports_its_own_failure() -> None:
    failure: dict[str, object] = {"type": "error", "message": "Redis is unreachable", "code": "unavailable"}
    client, requests = client_with(
        lambda request: httpx.Response(200, content=sse_body(("1-0", delta(2, "a")), (None, failure))),
        lambda request: httpx.Response(200, content=sse_body(("2-0", DONE))),
    )
    assert [event.id for event in client.follow("job")] == ["1-0", "2-0"]
    assert requests[1].headers["Last-Event-ID"] == "1-0"


def test_follow_from_a_cursor_past_the_end_yields_nothing() -> None:
    page = {"events": [], "cursor": "4-0", "status": "completed", "done": True}
    client, requests = client_with(
        lambda request: httpx.Response(200, content=b""),
        lambda request: httpx.Response(200, json=page),
    )
    assert list(client.follow("job", after="4-0")) == []
    assert requests[1].url.params["after"] == "4-0"  # asked by long-poll whether anything is left
    assert requests[1].headers["Accept"] != "text/event-stream"


def test_follow_gives_up_after_its_reconnects_and_raises_the_last_failure() -> None:
    def refuse(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("connection refused")

    client, requests = client_with(*[refuse] * 6)
    with pytest.raises(GatewayError) as raised:
        list(client.follow("job"))
    assert raised.value.error_type == "unreachable"
    assert len(requests) == 1 + client.reconnects


def test_follow_does_not_retry_a_permanent_error() -> None:
    client, requests = client_with(
        lambda request: httpx.Response(410, json={"error": "too old", "error_type": "cursor_expired"})
    )
    with pytest.raises(GatewayError, match="too old"):
        list(client.follow("job", after="1-0"))
    assert len(requests) == 1
